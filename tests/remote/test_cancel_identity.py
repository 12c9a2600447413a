"""Cancel and timeouts signal only the job itself, and all of it (issue #27): a finished job's outcome
is never rewritten, a pid reused by an unrelated process is left alone (the job is known by its
leader's pid *and* start time), and workers in process groups of their own within the job's session
are stopped with it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bench.remote import outcome
from tests.remote.conftest import group_members
from tests.remote.helpers import cli, eventually, read_remote, small_repo, status, submit, wait_for

# Stands in for `python -m dsv4bench ...`: a sweep whose worker runs in a process group of its own
# (same session, as a sweep's pool worker may) and, like the sweep, ignores TERM.
WORKERS = f"""#!/bin/sh
exec {shlex.quote(sys.executable)} -c '
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = os.fork()
if worker == 0:
    os.setpgid(0, 0)
    time.sleep(120)
    os._exit(0)
os.setpgid(worker, worker)
print("worker", worker, flush=True)
time.sleep(120)'
"""


@pytest.fixture
def impostor():
    """An unrelated process in a session of its own, as `setsid sleep` is: the one that reused a pid."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def workers_python(tmp_path) -> Path:
    path = tmp_path / "workers-python"
    path.write_text(WORKERS)
    path.chmod(0o755)
    return path


@pytest.fixture
def worker_of():
    """worker_of(job) -> the pid of the job's worker once it runs; a leftover is killed at teardown."""
    started: dict[int, str | None] = {}

    def find(job) -> int:
        eventually(lambda: "worker " in _log(job))
        pid = int(_log(job).split("worker ")[1].split()[0])
        started[pid] = _start_time(pid)
        return pid

    yield find
    for pid, start in started.items():
        if start and _start_time(pid) == start:  # still that worker, not a process that reused its pid
            os.kill(pid, signal.SIGKILL)


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _log(job) -> str:
    path = Path(job.remote_dir, "output.log")
    return path.read_text() if path.exists() else ""


def _session(sid: int) -> list[str]:
    """Live (non-zombie) processes of session `sid`, as `ps` lines."""
    out = subprocess.run(["ps", "-eo", "sid=,pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[0] == str(sid) and not line.split()[2].startswith("Z")]


def test_cancel_of_a_finished_job_signals_nothing_and_keeps_its_outcome(make_host, stub_python, tmp_path, impostor):
    make_host(python=str(stub_python / "fakepython"))
    job = submit("loop", ["exit", "0"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    assert wait_for(job).outcome == outcome.PASS
    recorded = read_remote(job, "exit")
    Path(job.remote_dir, "pgid").write_text(f"{impostor.pid}\n")  # the job's old id, now another's
    res = cli("remote", "cancel", job.id)
    assert res.code == 0, res.output
    assert f"job already finished (exit {recorded.strip()}): not cancelled" in res.output
    assert f"job {job.id} on loop: PASS" in res.output
    assert impostor.poll() is None
    assert read_remote(job, "exit") == recorded and not Path(job.remote_dir, "cancelled").exists()
    assert cli("remote", "status", job.id).code == 0


def test_cancel_leaves_a_process_that_reused_the_leaders_pid(make_host, stub_python, tmp_path, impostor):
    """The wrapper and the job died without an outcome (say, the OOM killer); their pids were reused."""
    make_host(python=str(stub_python / "fakepython"))
    job = submit("loop", ["hang"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    eventually(lambda: "hang:" in _log(job))
    pgid = int(read_remote(job, "pgid"))
    os.kill(int(read_remote(job, "pid")), signal.SIGKILL)
    os.killpg(pgid, signal.SIGKILL)
    eventually(lambda: group_members(pgid) == [])
    Path(job.remote_dir, "pgid").write_text(f"{impostor.pid}\n")  # its start time is not the leader's
    res = cli("remote", "cancel", job.id)
    assert res.code == 0, res.output
    assert impostor.poll() is None
    assert status(job).outcome == outcome.INFRA  # what it was: nothing was left to cancel


def test_cancel_stops_workers_in_process_groups_of_their_own(make_host, workers_python, worker_of, tmp_path):
    grace = 1
    make_host(python=str(workers_python), kill_grace_s=grace)
    job = submit("loop", ["sweep"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    worker = worker_of(job)
    sid = int(read_remote(job, "pgid"))
    assert os.getsid(worker) == sid and os.getpgid(worker) == worker != sid
    start = time.monotonic()
    res = cli("remote", "cancel", job.id)
    assert res.code == 0, res.output
    assert time.monotonic() - start < grace + 5
    assert _session(sid) == [] and group_members(worker) == []
    assert status(job).outcome == outcome.CANCELLED


def test_timeout_stops_workers_in_process_groups_of_their_own(make_host, workers_python, worker_of, tmp_path):
    make_host(python=str(workers_python), timeout_s=1, kill_grace_s=1)
    job = submit("loop", ["sweep"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    worker = worker_of(job)
    assert wait_for(job, timeout_s=30).outcome == outcome.TIMEOUT
    assert _session(int(read_remote(job, "pgid"))) == [] and group_members(worker) == []
