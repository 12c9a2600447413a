"""Faults are data: a hung or crashing compile costs one task, and a killed sweep resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.core.helpers import ROOT, cli_env, dsv4bench, records


def faulty_env(tmp_path, **extra):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    return cli_env(DSV4BENCH_PLUGINS="tests.plugins.faulty", FAULTY_PID_DIR=str(pid_dir), **extra)


def test_hang_becomes_timeout_and_crash_becomes_fail_runtime(tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = dsv4bench("sweep", "faulty", "--arch", "sm_90a", "--timeout", "6", "--out", str(out), env=faulty_env(tmp_path))
    elapsed = time.monotonic() - t0
    recs = {(r["params"]["behaviour"], r["params"]["i"], r["mode"]): r for r in records(out)}
    assert recs[("hang", 1, "compile")]["status"] == "TIMEOUT", res.stdout
    assert "6 s" in recs[("hang", 1, "compile")]["reason"]
    assert recs[("crash", 2, "compile")]["status"] == "FAIL_RUNTIME"
    assert "exit 11" in recs[("crash", 2, "compile")]["reason"]
    # the cases after the hang and the crash still ran, each in a fresh worker
    assert recs[("ok", 3, "compile")]["status"] == "COMPILED"
    assert recs[("ok", 0, "compile")]["status"] == "COMPILED"
    assert all(r["status"] == "PASS" for (_, _, mode), r in recs.items() if mode == "check")
    assert res.returncode == 4  # the worst status was a TIMEOUT
    assert elapsed < 120, f"sweep took {elapsed:.0f}s"
    # the hung compiler's forked child died with its process group
    children = list((tmp_path / "pids").iterdir())
    assert children, "the hanging compile never forked its child"
    for f in children:
        pid = int(f.read_text())
        try:
            os.kill(pid, 0)
            alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, f"child {pid} of the hung compile survived"


def test_killed_sweep_resumes_without_losing_or_repeating_records(tmp_path):
    out = tmp_path / "run"
    env = faulty_env(tmp_path, FAULTY_BEHAVIOURS="slow,slow,slow,slow,slow,slow", FAULTY_SECONDS="1.5")
    cmd = [sys.executable, "-m", "dsv4bench", "sweep", "faulty", "--arch", "sm_90a", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while len(records(out)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # a hard kill, mid-sweep
    proc.wait()
    first = records(out)
    assert 3 <= len(first) < 12
    res = dsv4bench("sweep", "faulty", "--arch", "sm_90a", "--out", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "already done" in res.stdout
    final = records(out)
    keys = [r["task"] for r in final]
    assert len(keys) == len(set(keys)) == 12  # 6 compiles + 6 checks, each exactly once
    assert final[: len(first)] == first  # the records of the killed run are untouched
    assert (out / "results.csv").read_text().count("\n") == 13


def test_cpu_check_skips_cases_too_large_for_the_cpu(tmp_path):
    from dsv4bench.core.case import Case
    from dsv4bench.core.worker import Worker

    worker = Worker()
    big = Case("rmsnorm", {"m": 1 << 17, "n": 7168, "dtype": "bf16", "weight": True})  # 3.5 GiB moved
    task = {"run_id": "r", "key": "k", "case": big.to_json(), "impl": "torch", "arch": "cpu", "mode": "check"}
    rec = worker.handle(task)
    assert rec.status == "UNSUPPORTED" and "CPU check skipped" in rec.reason
    small = Case("rmsnorm", {"m": 3, "n": 64, "dtype": "bf16", "weight": True})
    assert worker.handle({**task, "case": small.to_json()}).status == "PASS"
