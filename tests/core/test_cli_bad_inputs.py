"""Issue #27, defect 8: each bad input is one line naming the bad value or file, exit status 2,
never a traceback and never exit 0 for a request that did nothing; a run whose error metrics are
all inf/NaN still gets its index.html.

The CLI runs in-process through its real entry point (cli.main.main, which turns UsageProblem into
the one line and the exit status): an exception escaping it fails the test as a traceback would.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from dsv4bench.cli import main as cli_main
from dsv4bench.core.case import Case
from dsv4bench.core.results import RunDir
from tests.core.helpers import dsv4bench
from tests.report import report_synth

CASE = Case("rmsnorm", {"dtype": "bf16", "m": 64, "n": 128, "weight": True})


@pytest.fixture
def cli(monkeypatch, capsys):
    """cli(*args) -> (exit status, everything printed)."""
    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["dsv4bench", *args])
        with pytest.raises(SystemExit) as exc:
            cli_main.main()
        out = capsys.readouterr()
        return exc.value.code, out.out + out.err
    return run


def run_with_meta(path: Path, meta: str) -> Path:
    path.mkdir(parents=True)
    (path / "run.json").write_text(meta)
    return path / "run.json"


# Each builds its bad input under tmp and returns (argv, text the one line must contain).
def repro_corrupt_run_json(tmp: Path):
    meta = run_with_meta(tmp / "runs" / "r1", '{"cases": {')
    return ["repro", CASE.id, "--runs", str(tmp / "runs")], str(meta)


def report_run_json_is_a_list(tmp: Path):
    meta = run_with_meta(tmp / "run", "[1, 2]")
    return ["report", str(meta.parent)], str(meta)


def layouts_json_to_a_directory(tmp: Path):
    return ["layouts", "rmsnorm", "--json", str(tmp)], str(tmp)


def layouts_json_under_a_file(tmp: Path):
    (tmp / "file").write_text("")
    return ["layouts", "rmsnorm", "--json", str(tmp / "file" / "out.json")], str(tmp / "file" / "out.json")


def make_checkpoint_out_is_a_file(tmp: Path):
    (tmp / "file").write_text("")
    return ["make-checkpoint", "--config", "tiny", "--out", str(tmp / "file")], str(tmp / "file")


def repro_recorded_case(tmp: Path, impl: str):
    run_with_meta(tmp / "runs" / "r1", json.dumps({"cases": {CASE.id: CASE.to_json()}}))
    return ["repro", CASE.id, "--runs", str(tmp / "runs"), "--impl", impl]


def repro_bogus_impl(tmp: Path):
    return repro_recorded_case(tmp, "bogus"), "no impl 'bogus'"


def repro_gpu_impl_without_gpu(tmp: Path):
    return repro_recorded_case(tmp, "torch_compile"), "nothing to compare for rmsnor-"


def run_model(*args: str):
    return lambda tmp: (["run-model", "--prompt", "hi", "--max-new-tokens", "2", *args], f"got {args[-1]}")


def sweep_width_off_the_grid(tmp: Path):
    """A shape option that selects (no Option.extends) names the grid's values when it selects nothing;
    --rows 96 (it extends: every layer at M 96) is not blamed."""
    return (["sweep", "gemm", "--rows", "96", "--width", "5", "--examples", "0", "--compile-only", "--out",
             str(tmp / "run")], "matches the given options; --width 5: the grid has 64, 128, 512, ")


BAD_INPUTS = {
    "sweep-width-off-the-grid": sweep_width_off_the_grid,
    "repro-corrupt-run-json": repro_corrupt_run_json,
    "report-run-json-list": report_run_json_is_a_list,
    "layouts-json-directory": layouts_json_to_a_directory,
    "layouts-json-unwritable": layouts_json_under_a_file,
    "run-model-seed-overflow": run_model("--seed", "99999999999999999999999"),
    "run-model-seed-negative": run_model("--seed", "-1"),
    "run-model-temperature-nan": run_model("--temperature", "nan"),
    "run-model-temperature-inf": run_model("--temperature", "inf"),
    "make-checkpoint-out-file": make_checkpoint_out_is_a_file,
    "repro-bogus-impl": repro_bogus_impl,
    "repro-nothing-to-compare": pytest.param(repro_gpu_impl_without_gpu, marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="torch_compile runs on a GPU")),
}


def assert_one_line_exit_2(code: int, out: str, names: str) -> None:
    assert code == 2, out
    assert "Traceback" not in out
    assert out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
    assert names in out, out


@pytest.mark.parametrize("bad_input", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_line_naming_it_exit_2(bad_input, tmp_path, cli):
    args, names = bad_input(tmp_path)
    assert_one_line_exit_2(*cli(*args), names)


def test_threads_beyond_the_cpus_is_refused_not_a_segfault():
    """In a subprocess: unchecked, torch starting 100000 threads crashed the process (SIGSEGV)."""
    res = dsv4bench("run-model", "--prompt", "hi", "--max-new-tokens", "2", "--threads", "100000", timeout=120)
    assert_one_line_exit_2(res.returncode, res.stdout + res.stderr, "got 100000")


def test_report_renders_inf_and_nan_errors(tmp_path, cli):
    run, cases = report_synth.make_run(tmp_path / "run", 4, failing=(0, 1, 2, 3))
    inf_cases = {c.id for c in cases[:2]}
    records = run.records()
    for r in records:  # our impl's errors: inf in two cases, NaN in the other two
        if r.impl == "cutedsl":
            bad = math.inf if r.case_id in inf_cases else math.nan
            r.metrics["out"].update(max_abs=bad, mean_abs=bad, rel_l2=bad)
    run.results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    code, out = cli("report", str(run.path))
    assert code == 0, out
    html = (run.path / "index.html").read_text()
    ratios = re.findall(r'<tr class="failure".*?<td class="num">([^<]*)</td>', html, re.S)
    assert sorted(ratios) == ["inf", "inf", "nan", "nan"]
    assert html.count('class="plot heatmap"') == 3  # ours (with the inf/NaN cells) and the two peers
    assert RunDir(run.path).csv.exists()


def test_make_checkpoint_takes_every_seed_the_cli_allows(tmp_path, cli):
    """A seed near the top of 0..2**64-1 used to overflow torch's manual_seed inside the generator."""
    code, out = cli("make-checkpoint", "--config", "tiny", "--out", str(tmp_path / "ck"), "--seed", str(2**64 - 1))
    assert code == 0 and "Traceback" not in out, out
    assert (tmp_path / "ck" / "config.json").is_file()
