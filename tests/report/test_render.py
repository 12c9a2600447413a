"""`dsv4bench report RUN_DIR` on a timed run: contents, self-containment, bad input."""

from __future__ import annotations

import json
import re
import sys

import pytest

import report_synth
from dsv4bench.cli import main as cli_main
from dsv4bench.report.build import write_report
from html_check import decode_png, find, parse


@pytest.fixture(scope="module")
def timed_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("timed") / "run"
    run, cases = report_synth.make_run(path, 24, failing=(0, 1))
    report = write_report(path, axes=("hd", "s_kv"))
    return report, cases, parse(report.index.read_text())


def test_summary_counts_and_seed(timed_report):
    report, cases, els = timed_report
    verdict = find(els, id="verdict")[0].text
    assert "2 failing results in 2 cases" in verdict and "24 cases" in verdict and "72 results" in verdict
    chips = {e.attrs["data-status"]: e.text for e in find(els, "span", "chip") if "data-status" in e.attrs}
    assert chips == {"FAIL_NUMERIC": "FAIL_NUMERIC 2", "PASS": "PASS 70"}
    assert find(els, id="seed")[0].text == "0"


def test_failures_carry_their_repro_command(timed_report):
    report, cases, els = timed_report
    rows = find(els, "tr", "failure")
    assert [r.attrs["data-case-id"] for r in rows] == [c.id for c in cases[:2]]
    for row, case in zip(rows, cases):
        assert f"dsv4bench repro {case.id} --runs {report.index.parent.resolve()} --impl cutedsl" in row.text
        assert "FAIL_NUMERIC" in row.text and "3.5" in row.text  # err/bound of the planted failure


def test_plots_are_embedded_pngs(timed_report):
    _, _, els = timed_report
    imgs = find(els, "img", "plot")
    kinds = {c for img in imgs for c in img.classes} - {"plot"}
    assert kinds == {"heatmap", "roofline", "limit-bars"}
    assert len(find(els, "img", "heatmap")) == 3  # one per impl that was compared
    for img in imgs:
        pixels = decode_png(img.attrs["src"])
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0.05  # drawn on, not blank


def test_perf_table_has_peers_as_ratios_and_percent_of_limit(timed_report):
    _, cases, _ = timed_report
    cells = find(parse(_row_html(timed_report, cases[5].id, "flashmla")), "td")
    ratio = float(cells[-1].text.rstrip("×"))
    assert 1.1 < ratio < 1.4  # the synthetic peer is 1.25x our time: speedup = its ms / ours ms
    assert cells[-1].classes & {"sp-win", "sp-win2"}  # green: ours faster
    pct = float(cells[9].text)
    assert 0 < pct < 100


def _row_html(timed_report, case_id: str, impl: str) -> str:
    html = timed_report[0].index.read_text()
    perf = html[html.index('<table class="perf">'):]
    for row in perf.split("<tr")[1:]:
        if f'data-case-id="{case_id}" data-impl="{impl}"' in row:
            return "<tr" + row.split("</tr>")[0]
    raise AssertionError("row not found")


def test_matrix_methodology_and_no_urls(timed_report):
    report, cases, els = timed_report
    html = report.index.read_text()
    # opens offline and loads nothing: images are data URIs, links stay in the page, no scripts or URLs
    assert all(e.attrs["src"].startswith("data:image/png;base64,") for e in els if "src" in e.attrs)
    assert all(e.attrs["href"].startswith("#") for e in els if "href" in e.attrs)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    assert not re.search(r"(https?:|ftp:|file:|<script|<link|<iframe|@import|url\()", text, re.I)
    matrix_rows = [r for r in find(els, "tr") if r.attrs.get("data-case-id") and "failure" not in r.classes]
    assert {r.attrs["data-case-id"] for r in matrix_rows} == {c.id for c in cases}
    method = find(els, "section", id="methodology")[0].text
    for needle in ("L2 flushed", "CUDA events", "at least 25 ms", "first quarter", "NVIDIA H100 80GB HBM3", "580.65", "1980", "abc1234",
                   "nvidia-cutlass-dsl", "4.8.1", "2970", "795"):
        assert needle in method, needle
    assert report.csv.exists()


def _cli(monkeypatch, *args) -> int:
    monkeypatch.setattr(sys, "argv", ["dsv4bench", *args])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    return exc.value.code


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    cases = [(str(tmp_path / "missing"), "does not exist"), (str(tmp_path / "empty"), "is not a run directory"),
             (str(tmp_path / "file"), "is not a directory")]
    for path, message in cases:
        assert _cli(monkeypatch, "report", path) == 2
        err = capsys.readouterr().out
        assert message in err and len(err.strip().splitlines()) == 1


def test_bad_axes_and_bad_against_exit_2(tmp_path, monkeypatch, capsys):
    report_synth.make_run(tmp_path / "run", 3, failing=())
    assert _cli(monkeypatch, "report", str(tmp_path / "run"), "--axes", "hd,nope") == 2
    assert "no param 'nope'" in capsys.readouterr().out
    assert _cli(monkeypatch, "report", str(tmp_path / "run"), "--against", str(tmp_path / "other")) == 2
    assert "does not exist" in capsys.readouterr().out
    assert _cli(monkeypatch, "report", str(tmp_path / "run")) == 0
    assert f"report: {tmp_path / 'run' / 'index.html'}" in capsys.readouterr().out


def test_unsupported_reasons_are_text(tmp_path):
    run, cases = report_synth.make_run(tmp_path / "run", 3, failing=())
    records = run.records()
    for r in records[:2]:
        r.status, r.reason, r.timing, r.perf = "UNSUPPORTED", "head_dim > 256 is not supported", None, None
    run.results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    rows = find(parse(write_report(run.path).index.read_text()), "tr", "unsupported")
    assert len(rows) == 2  # one row per impl x reason, the reason as text (not only a tooltip)
    assert all("head_dim > 256 is not supported" in r.text for r in rows)


def test_a_retimed_row_says_how_many_sample_sets_were_retaken(tmp_path):
    """core/timing.steady drops transient sample sets; the perf table says so beside the iterations."""
    run, cases = report_synth.make_run(tmp_path / "run", 4, failing=())
    lines = run.results.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["timing"]["retimed"] = 2
    run.results.write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    html = write_report(tmp_path / "run").index.read_text()
    perf = html[html.index('<table class="perf">'):]
    rows = {r.split(">", 1)[0]: r for r in perf.split("<tr")[1:]}
    marked = [head for head, row in rows.items() if "retaken" in row.split("</tr>")[0]]
    assert len(marked) == 1 and f'data-case-id="{rec["case_id"]}" data-impl="{rec["impl"]}"' in marked[0]
    assert "+2 retaken" in rows[marked[0]]
