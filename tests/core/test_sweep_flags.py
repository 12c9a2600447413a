"""The sweep's flags (issue #26): --compile-only checks nothing, --examples draws under the filters,
--baseline names are checked, a resume into another sweep's --out is refused, a sweep never writes
under sweeps/ (`regressions add` promotes), and without a terminal progress is one line per task."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from dsv4bench.core import regressions
from dsv4bench.core.case import Case
from dsv4bench.core.filters import cases_under_filters
from dsv4bench.core.registry import SweepOptions, load_family
from dsv4bench.core.results import FAIL_NUMERIC, PASS, TIMEOUT, ResultRecord, RunDir
from dsv4bench.core.runner import plan
from tests.core.helpers import ROOT, cli_env, dsv4bench, records


def in_process(monkeypatch, *argv: str) -> int:
    """The CLI's exit status, run in this process (no worker is started by the paths tested here)."""
    from dsv4bench.cli import main as cli_main

    monkeypatch.setattr(sys, "argv", ["dsv4bench", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    return exit_.value.code or 0


# --- --compile-only -----------------------------------------------------------------------------

def test_compile_only_plans_no_cpu_check_unless_asked():
    family = load_family("rmsnorm")
    cases = family.cases(SweepOptions(examples=0))[:2]
    modes = {t.mode for t in plan(cases, ["sm_90a"], gpu=False, bench=False, compile_only=True)}
    assert modes == {"compile"}
    checked = plan(cases, ["sm_90a"], gpu=False, bench=False, compile_only=True, cpu_check=True)
    assert sum(t.mode == "check" for t in checked) == len(cases)


# --- --examples under the filters ---------------------------------------------------------------

def test_examples_are_drawn_under_the_filters():
    family = load_family("fmha")
    opts = SweepOptions(examples=10, seed=0, grid=False, filters=family.parse_filters({"hd": "512"}))
    cases, _ = cases_under_filters(family, opts)
    assert len(cases) == 10 and {c["hd"] for c in cases} == {512}
    assert cases_under_filters(family, opts)[0] == cases  # the same ones for the same seed


def test_too_few_matching_draws_are_said_in_one_line(capsys):
    from dsv4bench.cli.sweep import draw_cases

    family = load_family("rmsnorm")
    opts = SweepOptions(examples=3, seed=0, grid=False, filters=family.parse_filters({"width": "7"}))
    assert draw_cases(family, opts) == []
    lines = [line for line in capsys.readouterr().out.splitlines() if "--examples" in line]
    assert len(lines) == 1 and "only 0 drawn case(s) satisfy the filters" in lines[0]


def test_an_extending_option_adds_the_grid_at_an_asked_value():
    """`--rows 96` (gemm's M extends the grid): every grid shape at M 96, origin cli, beside the grid's
    own values asked; the other options still select (only K 4096 and N 512 here); options that do not
    extend (--width) keep selecting only."""
    family = load_family("gemm")
    pick = lambda **raw: family.cases(SweepOptions(examples=0, filters=family.parse_filters(raw)))  # noqa: E731
    cases = pick(rows="96,1", op="gemm")
    assert {(c["m"], c.origin) for c in cases} == {(96, "cli"), (1, "grid")}
    at_96 = {c["layer"] for c in cases if c["m"] == 96}
    assert at_96 == {c["layer"] for c in cases if c["m"] == 1} and len(at_96) == 17
    assert {(c["layer"], c["n"], c["k"]) for c in pick(rows="96", width="512", depth="4096", op="gemm")} == {
        ("flash.wkv", 512, 4096)}
    assert pick(rows="1", width="5") == []


# --- --baseline -----------------------------------------------------------------------------------

def test_unknown_baseline_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    code = in_process(monkeypatch, "sweep", "rmsnorm", "--baseline", "torch,nosuch", "--compile-only",
                      "--examples", "0", "--out", str(tmp_path / "run"))
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 2 and len(out) == 1, out
    assert "'nosuch'" in out[0] and "torch" in out[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written


# --- run directory, resume, regressions, progress (real sweeps of the faulty family) -------------

def sweeps_tree() -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in (ROOT / "sweeps").rglob("*") if "__pycache__" not in p.parts}


def faulty_sweep(out, *args, behaviours: str = "ok,crash"):
    return dsv4bench("sweep", "faulty", "--compile-only", "--arch", "sm_90a", "--out", str(out), *args,
                     env=cli_env(DSV4BENCH_PLUGINS="tests.plugins.faulty", FAULTY_BEHAVIOURS=behaviours))


def test_sweep_records_failures_in_its_run_dir_only_and_resume_is_guarded(tmp_path, monkeypatch):
    monkeypatch.delenv(regressions.ENV_DIR, raising=False)  # the checked-in directory, as a user has it
    before = sweeps_tree()
    out = tmp_path / "run"
    first = faulty_sweep(out)
    assert first.returncode == 3, first.stdout + first.stderr  # the crash: FAIL_RUNTIME
    assert sweeps_tree() == before  # nothing written under sweeps/
    assert {r["mode"] for r in records(out)} == {"compile"}  # --compile-only: no CPU check ran
    # no terminal: one line per finished task with its status, case, impl and elapsed time
    task_lines = [line for line in first.stdout.splitlines() if line.startswith("[")]
    assert len(task_lines) == 2 and task_lines[0].startswith("[1/2] COMPILED faulty-")
    assert task_lines[1].startswith("[2/2] FAIL_RUNTIME faulty-") and " kernel sm_90a " in task_lines[1]
    assert task_lines[0].split()[-1].endswith("s") and "s: worker died" in task_lines[1]
    entries = [json.loads(line) for line in (out / "regressions.jsonl").read_text().splitlines()]
    assert [e["params"]["behaviour"] for e in entries] == ["crash"] and entries[0]["timeout_s"] == 300.0
    assert f"dsv4bench regressions add {out}" in first.stdout

    other = faulty_sweep(out, "--seed", "1")
    assert other.returncode == 2 and "seed: 0 -> 1" in other.stdout and "--force-merge" in other.stdout
    assert len(other.stdout.strip().splitlines()) == 1, other.stdout
    assert len(records(out)) == 2  # refused before running anything

    merged = faulty_sweep(out, "--seed", "1", "--force-merge", behaviours="ok")
    assert merged.returncode == 3, merged.stdout + merged.stderr  # the verdict of the whole directory
    assert "--force-merge" in merged.stdout and "[1/1] COMPILED faulty-" in merged.stdout
    meta = RunDir(out).read_meta()
    assert "--seed" not in meta["command"] and meta["options"]["seed"] == 0  # the first command stays
    assert meta["invocations"][-1]["invoked"].endswith("--seed 1 --force-merge")
    assert len(records(out)) == 3 and sweeps_tree() == before


# --- regressions add ------------------------------------------------------------------------------

def _rec(case: Case, status: str) -> ResultRecord:
    return ResultRecord(run_id="r", task=f"{case.id}|cutedsl|sm_90a|run", case_id=case.id, family=case.family,
                        impl="cutedsl", backend="cutedsl", arch="sm_90a", mode="run", device="cuda",
                        params=dict(case.params), seed=case.seed, origin=case.origin, status=status, reason="x")


def test_regressions_add_promotes_and_skips_short_timeouts(tmp_path, monkeypatch, capsys):
    run = RunDir(tmp_path / "run").create()
    run.write_meta({"kernel": "rmsnorm", "command": "dsv4bench sweep rmsnorm --timeout 5"})
    wrong, slow, fine = (Case("rmsnorm", {"m": m, "n": 8}) for m in (1, 2, 3))
    found = [_rec(wrong, FAIL_NUMERIC), _rec(slow, TIMEOUT), _rec(fine, PASS)]
    added = regressions.record_failures("rmsnorm", found, "abc", "dsv4bench sweep rmsnorm --timeout 5",
                                        run.path / regressions.RUN_FILE, 5.0)
    assert added == [wrong.id, slow.id]
    checked_in = regressions.regression_file("rmsnorm")  # the test's private directory (conftest)
    assert not checked_in.exists()  # recording in the run directory promotes nothing

    assert in_process(monkeypatch, "regressions", "add", str(run.path)) == 0
    out = capsys.readouterr().out
    assert [e["case_id"] for e in regressions.load_entries("rmsnorm")] == [wrong.id]
    assert "skipped 1 TIMEOUT case(s)" in out and "--short-timeouts" in out

    assert in_process(monkeypatch, "regressions", "add", str(run.path), "--status", "TIMEOUT",
                      "--short-timeouts") == 0
    assert [e["case_id"] for e in regressions.load_entries("rmsnorm")] == [wrong.id, slow.id]
    assert in_process(monkeypatch, "regressions", "add", str(run.path), "--status", "BOGUS") == 2


# --- progress -------------------------------------------------------------------------------------

def test_progress_without_a_terminal_prints_one_line_per_task():
    from dsv4bench.cli.progress import task_progress

    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False)
    case = Case("rmsnorm", {"m": 1, "n": 8})
    with task_progress(console, "rmsnorm", 2) as on_record:
        on_record(_rec(case, PASS))
        on_record(_rec(case, FAIL_NUMERIC))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"[1/2] PASS {case.id} cutedsl sm_90a run ") and lines[0].endswith("s")
    assert lines[1].startswith(f"[2/2] FAIL_NUMERIC {case.id} cutedsl") and lines[1].endswith(": x")
