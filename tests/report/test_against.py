"""`dsv4bench report RUN --against OTHER`: per-task verdicts, new failures, fixes."""

from __future__ import annotations

import sys

import pytest

import report_synth
from dsv4bench.cli import main as cli_main
from dsv4bench.report.against import compare_runs
from dsv4bench.report.verdict import FASTER, SAME
from html_check import find, parse


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    # before: cases 0 and 1 fail; after: case 1 is fixed, case 2 breaks, ours is 20% faster
    base, cases = report_synth.make_run(root / "before", 10, failing=(0, 1), jitter=0.005)
    new, _ = report_synth.make_run(root / "after", 10, failing=(0, 2), slow=0.8, jitter=0.005, seed=1)
    return base, new, cases


def test_verdicts_failures_and_fixes(two_runs):
    base, new, cases = two_runs
    cmp = compare_runs(base.records(), new.records(), str(base.path))
    assert [(c["case_id"], c["impl"], c["base_status"]) for c in cmp.new_failures] == [(cases[2].id, "cutedsl", "PASS")]
    assert [(c["case_id"], c["new_status"]) for c in cmp.fixes] == [(cases[1].id, "PASS")]
    ours = {r["case_id"]: r["verdict"] for r in cmp.rows if r["impl"] == "cutedsl"}
    assert ours == {c.id: FASTER for c in cases[3:]}  # timed in both runs
    assert {r["verdict"] for r in cmp.rows if r["impl"] != "cutedsl"} == {SAME}
    assert cmp.only_new == cmp.only_base == 0


def test_cli_prints_and_renders_the_comparison(two_runs, monkeypatch, capsys):
    base, new, cases = two_runs
    monkeypatch.setattr(sys, "argv", ["dsv4bench", "report", str(new.path), "--against", str(base.path)])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "FASTER 7" in out and "SAME 20" in out and "new failures 1" in out and "fixes 1" in out
    assert f"new failure {cases[2].id}" in out and f"fixed {cases[1].id}" in out
    els = parse((new.path / "index.html").read_text())
    assert find(els, "section", id="against")
    assert [e.attrs["data-case-id"] for e in find(els, "tr", "new-failure")] == [cases[2].id]
    assert [e.attrs["data-case-id"] for e in find(els, "tr", "fix")] == [cases[1].id]
    assert len(find(els, "tr", "verdict-FASTER")) == 7
