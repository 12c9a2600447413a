"""benchmarks/save_run.py: a run copied into the results dataset re-renders with `dsv4bench report`."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "report"))
from report_synth import make_run  # noqa: E402

from dsv4bench.core.results import RunDir  # noqa: E402
from dsv4bench.report.build import write_report  # noqa: E402


def _load():
    spec = importlib.util.spec_from_file_location("save_run", REPO / "benchmarks" / "save_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


save_run = _load()


def rows_of(dest: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress((dest / "results.jsonl.gz").read_bytes()).decode().splitlines()]


def test_sweep_run_lands_in_the_layout_and_re_renders(tmp_path):
    run, cases = make_run(tmp_path / "sweep-synth", 6)
    root = tmp_path / "results"
    save_run.main([str(run.path), "--family", "fmha", "--commit", "abc1234def5678", "--device", "h100",
                   "--root", str(root), "--backs", "a test figure"])
    dest = root / "fmha" / "2026-11-22-h100-abc1234"  # the date from run.json's start
    assert sorted(p.name for p in dest.iterdir()) == ["README.md", "results.jsonl.gz", "run.json"]
    assert gzip.decompress((dest / "results.jsonl.gz").read_bytes()) == run.results.read_bytes()  # as the sweep wrote it
    meta = json.loads((dest / "run.json").read_text())
    assert "cases" not in meta and "invocations" not in meta  # the large parts the report does not read
    assert meta["command"] == "dsv4bench sweep synthattn --bench --seed 0"
    assert meta["environment"]["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
    readme = (dest / "README.md").read_text()
    for text in ("dsv4bench sweep synthattn --bench --seed 0", "abc1234", "NVIDIA H100 80GB HBM3", "2026-11-22",
                 "a test figure", "dsv4bench report benchmarks/results/fmha/2026-11-22-h100-abc1234"):
        assert text in readme

    copy = shutil.copytree(dest, tmp_path / "render")
    report = write_report(copy)
    html = report.index.read_text()
    assert report.csv.exists() and "dsv4bench sweep synthattn --bench --seed 0" in html and "abc1234" in html
    assert len(RunDir(copy).records()) == len(cases) * 3


def test_csv_only_run_is_converted_and_samples_can_be_left_out(tmp_path):
    run, _ = make_run(tmp_path / "old", 4)
    records = [r.to_json() for r in run.records()]
    run.write_csv()
    run.results.unlink()  # an old run: results.csv only
    dest = save_run.save_sweep(run.path, "rmsnorm", "1234567", "h100", tmp_path / "results")
    assert rows_of(dest) == records
    assert "converted from the run's results.csv" in (dest / "README.md").read_text()

    lean = save_run.save_sweep(run.path, "rmsnorm", "1234567", "h100", tmp_path / "results", tag="lean",
                               drop_samples=True)
    assert lean.name == "2026-11-22-h100-1234567-lean"
    rows = rows_of(lean)
    timed = [r["timing"] for r in rows if r["timing"]]
    assert timed and all("samples_ms" not in t and "median_ms" in t and "p90_ms" in t for t in timed)
    write_report(lean)  # the report needs only the summary statistics


def test_an_existing_run_directory_is_not_overwritten_without_force(tmp_path):
    run, _ = make_run(tmp_path / "r", 2)
    root = tmp_path / "results"
    save_run.save_sweep(run.path, "fmha", "abcdef0", "h100", root)
    with pytest.raises(SystemExit, match="exists"):
        save_run.save_sweep(run.path, "fmha", "abcdef0", "h100", root)
    save_run.save_sweep(run.path, "fmha", "abcdef0", "h100", root, force=True)


@pytest.mark.parametrize("commit, date, device, tag", [
    ("HEAD", "2026-11-22", "h100", ""), ("abc1234", "22/11/2026", "h100", ""),
    ("abc1234", "2026-11-22", "H100 80GB", ""), ("abc1234", "2026-11-22", "h100", "Bad Tag")])
def test_bad_names_are_refused(commit, date, device, tag):
    with pytest.raises(SystemExit):
        save_run.run_dir_name(date, device, commit, tag)


def test_dirty_commit_names_the_commit():
    assert save_run.run_dir_name("2026-11-23", "h100", "dd79f24abc-dirty", "probe") == "2026-11-23-h100-dd79f24-probe"


def test_bench_json_becomes_one_row_per_measured_row(tmp_path):
    doc = {"commit": "aba9510", "device": {"gpu": "NVIDIA H100 80GB HBM3"}, "ceilings": {"copy_gbps": 3026.2},
           "results": [{"case": "pro_prefill", "impl": "cutedsl", "median_ms": 2.456, "params": {"hd": 512}},
                       {"case": "pro_prefill", "impl": "flashmla", "median_ms": 1.987, "ratio_vs_ours": 0.81}]}
    src = tmp_path / "fmha-h100.json"
    src.write_text(json.dumps(doc))
    save_run.main([str(src), "--json", "--family", "fmha", "--commit", "aba9510", "--date", "2026-11-23",
                   "--root", str(tmp_path / "results"), "--command", "python3 benchmarks/fmha_bench.py --out x.json"])
    dest = tmp_path / "results" / "fmha" / "2026-11-23-h100-aba9510"
    rows = rows_of(dest)
    assert rows == doc["results"]  # every field of every row
    readme = (dest / "README.md").read_text()
    assert "python3 benchmarks/fmha_bench.py --out x.json" in readme and '"copy_gbps": 3026.2' in readme


def test_probe_json_with_several_lists_names_each_group():
    rows, meta = save_run.json_rows({"note": "A/B", "run1": [{"variant": "a"}], "run2": [{"variant": "b"}]})
    assert rows == [{"group": "run1", "variant": "a"}, {"group": "run2", "variant": "b"}] and meta == {"note": "A/B"}


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.fmha.test_fmha_gpu" name="test_case[pro]" time="1.5"/>
<testcase classname="tests.fmha.test_fmha_gpu" name="test_case[flash]" time="0.5"><failure message="max err 3e-2">x</failure></testcase>
<testcase classname="tests.rmsnorm.test_rmsnorm_gpu" name="test_widths" time="2.0"/>
<testcase classname="tests.test_cli" name="test_env" time="0.1"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>
"""


def test_gpu_test_results_go_under_each_family(tmp_path):
    xml = tmp_path / "gpu-tests.xml"
    xml.write_text(JUNIT)
    dests = save_run.save_junit(xml, "abc1234", "h100", tmp_path / "results", "2026-11-25", "pytest -m gpu tests")
    assert [(d.parent.name, d.name) for d in dests] == [
        ("core", "2026-11-25-h100-abc1234-gpu-tests"), ("fmha", "2026-11-25-h100-abc1234-gpu-tests"),
        ("rmsnorm", "2026-11-25-h100-abc1234-gpu-tests")]
    fmha = rows_of(dests[1])
    assert [(r["test"], r["outcome"]) for r in fmha] == [
        ("tests.fmha.test_fmha_gpu::test_case[pro]", "passed"), ("tests.fmha.test_fmha_gpu::test_case[flash]", "failed")]
    assert fmha[1]["message"] == "max err 3e-2"
    assert "1 failed, 1 passed" in (dests[1] / "README.md").read_text()


def test_conformance_cases_go_under_the_family_their_id_names(tmp_path):
    xml = tmp_path / "conformance.xml"
    xml.write_text("""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.conformance.test_families" name="test_matches_oracle_on_gpu[gemm-cutedsl-gemm-1a2b]" time="1"/>
<testcase classname="tests.conformance.test_families" name="test_matches_oracle_on_gpu[rope-cutedsl-rope-3c4d]" time="1"/>
<testcase classname="tests.conformance.test_served_ops" name="test_served_op_matches_its_oracle_on_model_inputs[hc_pre]" time="1"/>
</testsuite></testsuites>""")
    dests = save_run.save_junit(xml, "abc1234", "h100", tmp_path / "results", "2026-11-25")
    assert [(d.parent.name, d.name) for d in dests] == [
        ("core", "2026-11-25-h100-abc1234-conformance"), ("gemm", "2026-11-25-h100-abc1234-conformance"),
        ("rope", "2026-11-25-h100-abc1234-conformance")]


def test_drop_samples_folds_the_short_kernels_of_a_cupti_split():
    split = {f"k{i}": float(i) for i in range(1, 11)}  # k10 longest
    rec = {"perf": {"kernels_us": dict(split)}}
    assert save_run.top_kernels(rec, keep=3) == 7
    kept = rec["perf"]["kernels_us"]
    assert list(kept) == ["k10", "k9", "k8", "(7 other kernels)"] and kept["(7 other kernels)"] == sum(range(1, 8))
    assert sum(kept.values()) == sum(split.values())
    short = {"perf": {"kernels_us": {"a": 1.0}}}
    assert save_run.top_kernels(short) == 0 and short["perf"]["kernels_us"] == {"a": 1.0}


def test_a_committed_run_reads_from_its_gzip_alone(tmp_path):
    """results.jsonl.gz is all a committed run keeps: records, report and repro read it."""
    from dsv4bench.cli.repro import _case_in_run

    run, _ = make_run(tmp_path / "r", 3)
    records = [r.to_json() for r in run.records()]
    dest = save_run.save_sweep(run.path, "fmha", "abcdef0", "h100", tmp_path / "results", drop_samples=True)
    assert not (dest / "results.jsonl").exists()
    back = [r.to_json() for r in RunDir(dest).records()]
    assert len(back) == len(records) and [b["task"] for b in back] == [r["task"] for r in records]
    report = write_report(shutil.copytree(dest, tmp_path / "render"))
    assert report.index.exists()
    (dest / "run.json").unlink()  # a bare results.jsonl.gz still names its cases
    found = _case_in_run(dest, back[0]["case_id"])
    assert found is not None and found[0].params == back[0]["params"]
