"""The run directory (issue #27): one sweep at a time writes it, and a record torn by a crash
mid-write is cut before the next one is appended."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from dsv4bench.core.results import ResultRecord, RunDir
from tests.core.helpers import ROOT, cli_env, dsv4bench, records

HOLD = "import sys, time; from dsv4bench.core.results import RunDir; " \
       "run = RunDir(sys.argv[1]).create(); print('held', flush=True); time.sleep(120)"


@pytest.fixture
def holder(tmp_path):
    """Another process that holds tmp_path/run, as a sweep does while it runs."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=ROOT, env=cli_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()


def record(task: str) -> ResultRecord:
    return ResultRecord(run_id="run", task=task, case_id="c", family="f", impl="i", backend="", arch="cpu",
                        mode="check", device="cpu", params={}, seed=0, origin="grid", status="PASS")


@pytest.mark.timeout(120)
def test_a_second_sweep_on_the_same_out_refuses_in_one_line_naming_the_holder(tmp_path, holder):
    out = tmp_path / "run"
    res = dsv4bench("sweep", "faulty", "--arch", "sm_90a", "--out", str(out),
                    env=cli_env(DSV4BENCH_PLUGINS="tests.plugins.faulty", FAULTY_BEHAVIOURS="ok"))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert f"pid {holder.pid} on {socket.gethostname()}, started 20" in lines[0]
    assert str(out) in lines[0] and "another sweep is writing it" in lines[0]
    assert not (out / "run.json").exists() and records(out) == []  # it touched nothing


def test_the_lock_of_a_dead_sweep_is_taken_over(tmp_path, holder, capsys):
    with pytest.raises(OSError, match=f"another sweep is writing it \\(pid {holder.pid} on "):
        RunDir(tmp_path / "run").create()
    holder.send_signal(signal.SIGKILL)  # dies holding it: the kernel drops the flock, the text stays
    holder.wait()
    run = RunDir(tmp_path / "run").create()
    said = capsys.readouterr().err
    assert f"taking over the lock of a sweep that is gone (pid {holder.pid} on " in said
    assert json.loads((run.path / ".lock").read_text())["pid"] == os.getpid()


def test_one_process_may_open_its_run_directory_twice(tmp_path):
    first = RunDir(tmp_path / "run").create()
    second = RunDir(tmp_path / "run").create()  # shares the lock, does not refuse itself
    second.append(record("a"))
    assert [r.task for r in first.records()] == ["a"]


def test_a_torn_last_line_is_cut_before_the_first_append(tmp_path, capsys):
    run = RunDir(tmp_path / "run").create()
    run.append(record("done"))
    with open(run.results, "a") as f:
        f.write(json.dumps(record("torn").to_json())[:50])  # a crash mid-write
    resumed = RunDir(tmp_path / "run").create()
    del run
    resumed.append(record("torn"))
    resumed.append(record("next"))
    lines = run_lines(resumed)
    assert [json.loads(line)["task"] for line in lines] == ["done", "torn", "next"]
    said = capsys.readouterr().err
    assert said.count("dropped a torn last line (50 bytes") == 1, said


def test_a_complete_last_record_missing_its_newline_is_kept(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.jsonl").write_text(json.dumps(record("done").to_json()))  # no newline
    run = RunDir(tmp_path / "run").create()
    run.append(record("next"))
    assert [json.loads(line)["task"] for line in run_lines(run)] == ["done", "next"]
    assert "torn" not in capsys.readouterr().err


def run_lines(run: RunDir) -> list[str]:
    text = run.results.read_text()
    assert text.endswith("\n")
    return text.splitlines()
