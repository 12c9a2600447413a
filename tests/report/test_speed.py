"""How fast ours is: speedups from hand-picked times, NOISY rows, results.csv columns, the bar
chart's labels, and `report --against --fail-on` exit codes."""

from __future__ import annotations

import csv
import json
import random
import sys

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import report_synth
from dsv4bench.cli import main as cli_main
from dsv4bench.core.results import PASS, ResultRecord, RunDir, read_csv
from dsv4bench.report import plots, tables
from dsv4bench.report.build import write_report
from dsv4bench.report.speedup import NOISY_CV, rows_params, shape_classes, speed

# (m, layer) -> median ms of ours, deepgemm, cublaslt; the last case's deepgemm timing is noisy
TIMES = {(64, "flash.wq_a"): (1.0, 2.0, 0.5), (64, "pro.wo_b"): (2.0, 4.0, 2.5),
         (4096, "flash.wq_a"): (4.0, 2.0, 8.0), (4096, "pro.wo_b"): (1.0, 9.0, 1.0)}
NOISY_CASE = (4096, "pro.wo_b")


def _record(m: int, layer: str, impl: str, ms: float, cv: float = 0.01) -> ResultRecord:
    case_id = f"gemm-{m}-{layer}"
    return ResultRecord(
        run_id="hand", task=f"{case_id}|{impl}|sm_90a|run", case_id=case_id, family="gemm", impl=impl,
        backend=impl, arch="sm_90a", mode="run", device="cuda", params={"layer": layer, "m": m, "n": 1024},
        seed=0, origin="grid", status=PASS, reason="ok",
        timing={"median_ms": ms, "p10_ms": ms * (1 - 1.3 * cv), "p90_ms": ms * (1 + 1.3 * cv), "mean_ms": ms,
                "cv": cv, "n": 50, "l2_flush": True})


def hand_records() -> list[ResultRecord]:
    out = []
    for (m, layer), times in TIMES.items():
        for impl, ms in zip(("cutedsl", "deepgemm", "cublaslt"), times):
            noisy = (m, layer) == NOISY_CASE and impl == "deepgemm"
            out.append(_record(m, layer, impl, ms, cv=2 * NOISY_CV if noisy else 0.01))
    return out


def test_ours_is_the_shipped_impl_not_a_variant_of_it():
    """A run that times `cutedsl:<variant>` beside `cutedsl` (same backend) takes the speedups of
    `cutedsl`, whichever record comes last, and does not count the variant as a peer."""
    recs = hand_records()
    for r in list(recs):
        if r.impl == "cutedsl":  # a variant 10x slower, written after the shipped impl's record
            v = _record(r.params["m"], r.params["layer"], "cutedsl:slow", r.timing["median_ms"] * 10)
            recs.append(ResultRecord(**{**v.__dict__, "backend": "cutedsl"}))
    base, with_variant = speed(hand_records()), speed(recs)
    assert [s.peer for s in with_variant.per_peer] == ["cublaslt", "deepgemm"]
    assert [s.geomean for s in with_variant.per_peer] == [s.geomean for s in base.per_peer]


def test_geomean_wins_losses_worst_best_from_known_times():
    sp = speed(hand_records())
    deepgemm, cublaslt = sp.per_peer[1], sp.per_peer[0]
    assert [s.peer for s in sp.per_peer] == ["cublaslt", "deepgemm"]
    # deepgemm / ours: 2, 2, 0.5 (the 9x case is NOISY, left out of the mean)
    assert deepgemm.geomean == pytest.approx((2 * 2 * 0.5) ** (1 / 3))
    assert (deepgemm.wins, deepgemm.losses, deepgemm.noisy) == (2, 1, 1)
    assert deepgemm.worst.speedup == 0.5 and deepgemm.worst.case_id == "gemm-4096-flash.wq_a"
    assert deepgemm.best.speedup == 2.0
    # cublaslt / ours: 0.5, 1.25, 2, 1 (an even case is neither a win nor a loss)
    assert cublaslt.geomean == pytest.approx((0.5 * 1.25 * 2 * 1) ** 0.25)
    assert (cublaslt.wins, cublaslt.losses, cublaslt.noisy) == (2, 1, 0)
    assert sp.noisy_records == 1


def test_per_shape_class():
    assert shape_classes("gemm", {"m": 64, "layer": "x"}) == ("decode", "layer=x")
    assert shape_classes("gemm", {"m": 4096}) == ("prefill",)
    assert shape_classes("nosuchfamily", {"hd": 3}) == ()
    cls = {(s.peer, s.cls): s for s in speed(hand_records()).per_class}
    assert {c for _, c in cls} == {"decode", "prefill", "layer=flash.wq_a", "layer=pro.wo_b"}
    decode = cls[("deepgemm", "decode")]
    assert decode.geomean == pytest.approx(2.0) and (decode.wins, decode.losses) == (2, 0)
    prefill = cls[("deepgemm", "prefill")]
    assert prefill.geomean == pytest.approx(0.5) and prefill.noisy == 1
    assert cls[("cublaslt", "layer=flash.wq_a")].geomean == pytest.approx(1.0)  # 0.5 and 2


def test_compressor_splits_by_its_tokens_not_by_its_ratio():
    from sweeps import compressor

    assert rows_params("compressor") == ("s",)  # m is the compression ratio, 4 or 128
    classes = {(c["m"], c["b"], c["s"]): shape_classes("compressor", c) for c in compressor.production()}
    # (the indexer compressor's short ragged prefills, 5 / 7 / 151 tokens, are decode-sized rows)
    decode = {(4, 64, 8), (4, 128, 8), (4, 1, 4), (4, 1, 5), (4, 1, 7), (4, 1, 151), (128, 64, 128), (128, 128, 128),
              (128, 1, 128)}
    assert classes == {k: ("decode",) if k in decode else ("prefill",) for k in classes}
    assert {k[2] for k in classes if k not in decode} == {4096, 4097, 4098, 4099, 16384, 1001, 2002}


def _hand_run(path) -> RunDir:
    run = RunDir(path).create()
    run.write_meta({"kernel": "gemm", "seed": 0})
    run.results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in hand_records()))
    return run


def test_csv_has_peer_ms_speedup_and_noisy_columns_and_still_reads_back(tmp_path):
    run = _hand_run(tmp_path / "run")
    report = write_report(run.path)
    with open(report.csv, newline="") as f:
        rows = {(r["case_id"], r["impl"]): r for r in csv.DictReader(f)}
    ours = rows[("gemm-4096-flash.wq_a", "cutedsl")]
    assert float(ours["deepgemm_ms"]) == 2.0 and float(ours["speedup_vs_deepgemm"]) == 0.5
    assert float(ours["cublaslt_ms"]) == 8.0 and float(ours["speedup_vs_cublaslt"]) == 2.0
    assert rows[("gemm-4096-pro.wo_b", "deepgemm")]["noisy"] == "True"
    assert rows[("gemm-4096-pro.wo_b", "cutedsl")]["noisy"] == "False"
    assert rows[("gemm-4096-pro.wo_b", "deepgemm")]["speedup_vs_deepgemm"] == ""  # only on our rows
    back = read_csv(report.csv)  # the extra columns do not disturb the lossless reader
    assert [json.dumps(r.to_json(), sort_keys=True) for r in back] == \
        [json.dumps(r.to_json(), sort_keys=True) for r in run.records()]


def test_html_leads_with_speed_and_marks_noisy_rows(tmp_path):
    from html_check import find, parse

    report = write_report(_hand_run(tmp_path / "run").path)
    html = report.index.read_text()
    assert html.index('id="speed"') < html.index('id="summary"')
    els = parse(html)
    peers = {e.attrs["data-peer"]: e for e in find(els, "div", "peer")}
    assert "1.26×" in peers["deepgemm"].text and "2 wins" in peers["deepgemm"].text
    assert "1 NOISY left out" in peers["deepgemm"].text and "sp-win2" in peers["deepgemm"].classes
    noisy = find(els, "tr", "noisy")
    assert [(e.attrs["data-case-id"], e.attrs["data-impl"]) for e in noisy] == [("gemm-4096-pro.wo_b", "deepgemm")]
    assert "NOISY" in noisy[0].text
    rows = {(e.attrs["data-case-id"], e.attrs["data-impl"]): e for e in find(els, "tr") if "data-impl" in e.attrs}
    cell = {k: find(parse(html[html.index(f'data-case-id="{k[0]}" data-impl="{k[1]}"'):]), "td", "speedup")[0]
            for k in rows}
    assert "sp-win2" in cell[("gemm-64-flash.wq_a", "deepgemm")].classes  # 2x: ours much faster
    assert "sp-loss2" in cell[("gemm-4096-flash.wq_a", "deepgemm")].classes  # 0.5x: ours much slower
    assert cell[("gemm-4096-flash.wq_a", "deepgemm")].text.strip() == "0.5×"
    assert [tables.speedup_class(v) for v in (1.3, 1.1, 1.0, 0.9, 0.8, None)] == \
        ["sp-win2", "sp-win", "", "sp-loss", "sp-loss2", ""]
    legend = find(els, id="legend")[0]
    assert {e.attrs["data-impl"] for e in find(els, "span", "impl-swatch")} == {"cutedsl", "deepgemm", "cublaslt"}
    assert "ours faster" in legend.text and "ours slower" in legend.text


def test_bar_chart_labels_fit_inside_the_figure():
    run_records = []
    rng = random.Random(0)
    for i, case in enumerate(report_synth.cases(12)):
        case.params["a_rather_long_param_name"] = "x" * (10 + 5 * i)  # long, varying labels
        run_records += [report_synth.record("r", case, impl, backend, f, False, rng) for impl, backend, f in
                        report_synth.IMPLS]
    fig = plots.limit_bars_figure(tables.perf_rows(run_records), "t", plots.impl_colours(run_records))
    renderer = FigureCanvasAgg(fig).get_renderer()
    width = fig.get_size_inches()[0] * fig.dpi
    for label in fig.axes[0].get_yticklabels():
        box = label.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= width, (label.get_text(), box)


def _cli(monkeypatch, *args) -> int:
    monkeypatch.setattr(sys, "argv", ["dsv4bench", *args])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    return exc.value.code


@pytest.fixture(scope="module")
def ab_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("failon")
    base, _ = report_synth.make_run(root / "base", 6, failing=(0,), jitter=0.005)
    slower, _ = report_synth.make_run(root / "slower", 6, failing=(0,), slow=1.3, jitter=0.005, seed=1)
    broken, _ = report_synth.make_run(root / "broken", 6, failing=(0, 3), jitter=0.005, seed=2)
    return base.path, slower.path, broken.path


def test_fail_on_slower_and_new_failures(ab_runs, monkeypatch, capsys):
    base, slower, broken = map(str, ab_runs)
    assert _cli(monkeypatch, "report", slower, "--against", base) == 0  # default: unchanged behaviour
    assert _cli(monkeypatch, "report", slower, "--against", base, "--fail-on", "slower") == 1
    assert "5 task(s) SLOWER" in capsys.readouterr().out
    assert _cli(monkeypatch, "report", slower, "--against", base, "--fail-on", "new-failures") == 0
    assert _cli(monkeypatch, "report", broken, "--against", base, "--fail-on", "slower") == 0
    assert _cli(monkeypatch, "report", broken, "--against", base, "--fail-on", "new-failures") == 1
    assert "1 new failure(s)" in capsys.readouterr().out
    assert _cli(monkeypatch, "report", broken, "--fail-on", "slower") == 2  # needs --against
    assert _cli(monkeypatch, "report", broken, "--against", base, "--fail-on", "faster") == 2


def test_runs_with_no_task_in_common_are_refused(ab_runs, tmp_path, monkeypatch, capsys):
    other = _hand_run(tmp_path / "other").path
    capsys.readouterr()
    assert _cli(monkeypatch, "report", str(ab_runs[0]), "--against", str(other)) == 2
    out = capsys.readouterr().out
    assert "no task in common" in out and len(out.strip().splitlines()) == 1


def test_terminal_summary_leads_with_the_same_numbers(tmp_path, monkeypatch, capsys):
    from dsv4bench.cli.summary import print_summary

    run = _hand_run(tmp_path / "run")
    print_summary(run.records(), run)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    assert "speedup = peer ms / ours ms: > 1 ours faster" in out and "1 noisy rows left out" in out
    assert "geomean 1.26x, ours faster" in out and "2 wins, 1 losses of 3" in out and "1 NOISY left out" in out
    assert "worst 0.50x (gemm-4096-flash.wq_a)" in out and "best 2.00x" in out
    assert "decode" in out and "prefill" in out and "layer=pro.wo_b" in out
    assert "9.00x NOISY" in out  # the noisy row's speedup, marked, in the per-result table
    assert _cli(monkeypatch, "report", str(run.path)) == 0  # `dsv4bench report` prints the block too
    assert "geomean 1.26x" in " ".join(capsys.readouterr().out.split())


def test_one_stray_iteration_does_not_make_a_stable_median_noisy():
    from dsv4bench.report.speedup import is_noisy

    steady = _record(64, "flash.wq_a", "fa4", 0.0137, cv=0.01)
    steady.timing.update(p10_ms=0.0132, p90_ms=0.0147, cv=0.67)  # one 0.3 ms iteration among 50
    assert not is_noisy(steady)
    wide = _record(64, "flash.wq_a", "fa4", 0.0137, cv=0.01)
    wide.timing.update(p10_ms=0.008, p90_ms=0.020, cv=0.15)  # the middle 80% itself spread
    assert is_noisy(wide)
