"""Worker lifetimes and the result pipe (issue #27): a worker dies with its sweep, what a worker
starts dies with the worker, and nothing a worker does (or fails to do) on its result pipe crashes
or hangs the sweep. Every test checks the process table: nothing is left behind.

The planted faults come from a fake worker (FAKE_WORKER below, swapped in for the real one through
`runner.WORKER_COMMAND`) that speaks the worker protocol and arms its lifetime exactly as the real
worker does, and from the `faulty` test family run by the real CLI and worker.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dsv4bench.core import runner
from dsv4bench.core.case import Case
from dsv4bench.core.results import RunDir
from tests.core.helpers import ROOT, cli_env, records

MARK = "DSV4BENCH_TEST_MARK"  # every process a test starts inherits it: the process-table check finds them

# behaviour per task (the case's "behaviour" param), or at start (argv[1]):
#   ok          answer PASS              garbage     write a line that is not JSON
#   other-task  answer for another task  close       close the result pipe, then hang
#   hang        start children, hang     crash       start children, exit 7
#   cuda-fault  answer FAIL_RUNTIME with a CUDA fault's reason, then exit 3 as the real worker does,
#               after a slow teardown (a real context takes a while to go)
# "children": a forked child that leaves the group (setsid) and a subprocess left in the group;
# both inherit nothing that would end them, and never exit on their own.
FAKE_WORKER = r'''
import json, os, subprocess, sys, time
from dsv4bench.core.case import Case
from dsv4bench.core.results import ResultRecord
from dsv4bench.core.runner import ENV_RESULT_FD, bind_worker_to_sweep

bind_worker_to_sweep()
out = os.fdopen(int(os.environ[ENV_RESULT_FD]), "w", buffering=1)
if sys.argv[1] == "hang":
    time.sleep(3600)
out.write('{"ready": true}\n')


def record(task, key, status="PASS", reason=""):
    case = Case.from_json(task["case"])
    return json.dumps(ResultRecord(
        run_id=task["run_id"], task=key, case_id=case.id, family=case.family, impl=task["impl"], backend="",
        arch=task["arch"], mode=task["mode"], device="cpu", params=dict(case.params), seed=case.seed,
        origin=case.origin, status=status, reason=reason).to_json())


def start_children():
    child = os.fork()
    if child == 0:
        os.setsid()
        while True:
            time.sleep(1)
    sleeper = subprocess.Popen(["sleep", "3600"])
    if os.environ.get("FAKE_PID_DIR"):
        with open(os.path.join(os.environ["FAKE_PID_DIR"], "children"), "w") as f:
            f.write(f"{child} {sleeper.pid}")


for line in sys.stdin:
    task = json.loads(line)
    behaviour = task["case"]["params"]["behaviour"]
    if behaviour == "ok":
        out.write(record(task, task["key"]) + "\n")
    elif behaviour == "other-task":
        out.write(record(task, "someone|else|cpu|check") + "\n")
    elif behaviour == "cuda-fault":
        out.write(record(task, task["key"], "FAIL_RUNTIME", "AcceleratorError: CUDA error: an illegal memory access") + "\n")
        time.sleep(1.0)
        sys.exit(3)
    elif behaviour == "garbage":
        out.write("Traceback (most recent call last): not a record\n")
    elif behaviour == "close":
        out.close()
        time.sleep(3600)
    elif behaviour in ("hang", "crash"):
        start_children()
        if behaviour == "crash":
            os._exit(7)
        time.sleep(3600)
'''


def leftovers(mark: str) -> list[str]:
    """Live (not zombie) processes that carry `mark` in their environment: 'pid command'."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80]
        except OSError:
            continue  # gone, or not ours to read
        if f"{MARK}={mark}".encode() in env and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(f"{pid} {cmd.decode(errors='replace')}")
    return found


def assert_none_left(mark: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while leftovers(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftovers(mark), f"processes left behind: {leftovers(mark)}"


@pytest.fixture
def mark(monkeypatch):
    value = uuid.uuid4().hex
    monkeypatch.setenv(MARK, value)
    yield value
    for line in leftovers(value):  # never leak planted hangs into the rest of the suite
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    """Swap the fake worker in; `fake_worker("hang")` makes it hang before it says ready."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)

    def use(start: str = "ok") -> None:
        monkeypatch.setattr(runner, "WORKER_COMMAND", [sys.executable, str(script), start], raising=False)

    use()
    return use


def sweep(tmp_path, behaviours: list[str], timeout: float) -> list:
    """Run one task per behaviour in this process; the records, in order."""
    tasks = [runner.Task(Case("fake", {"i": i, "behaviour": b}), "fake", "cpu", "check")
             for i, b in enumerate(behaviours)]
    run_dir = RunDir(tmp_path / "run").create()
    got = []
    runner.Runner(run_dir, timeout_s=timeout, gpu=False).run(tasks, got.append)
    return got


# --- a worker dies with its sweep -------------------------------------------------------------

# a sweep in a process of its own (the runner as the CLI drives it, without the CLI's imports)
DRIVER = r'''
import json, sys
from dsv4bench.core import runner
from dsv4bench.core.case import Case
from dsv4bench.core.results import RunDir

spec = json.loads(sys.argv[1])
runner.WORKER_COMMAND = spec["worker"] or runner.WORKER_COMMAND
tasks = [runner.Task(Case(spec["family"], params), spec["impl"], spec["arch"], spec["mode"]) for params in spec["params"]]
runner.Runner(RunDir(spec["out"]).create(), timeout_s=120, gpu=False).run(tasks, lambda rec: None)
'''


def start_sweep(tmp_path, mark: str, real_worker: bool) -> subprocess.Popen:
    """A sweep whose one task hangs after starting children; returns once they are started. The real
    worker hangs in a `faulty` compile (holding its cache entry's lock) after forking a child; the
    fake one after forking a setsid child and starting a subprocess."""
    pids = tmp_path / "pids"
    pids.mkdir()
    if real_worker:
        spec = {"worker": None, "family": "faulty", "impl": "kernel", "arch": "sm_90a", "mode": "compile",
                "params": [{"i": 0, "behaviour": "hang", "seconds": 0.0}]}
    else:
        script = tmp_path / "fake_worker.py"
        script.write_text(FAKE_WORKER)
        spec = {"worker": [sys.executable, str(script), "ok"], "family": "fake", "impl": "fake", "arch": "cpu",
                "mode": "check", "params": [{"i": 0, "behaviour": "hang"}]}
    env = cli_env(DSV4BENCH_PLUGINS="tests.plugins.faulty", FAULTY_PID_DIR=str(pids), FAKE_PID_DIR=str(pids),
                  DSV4BENCH_CACHE_DIR=str(tmp_path / "cache"), **{MARK: mark})
    log = open(tmp_path / "sweep.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps({**spec, "out": str(tmp_path / "run")})],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # pytest under nohup
    deadline = time.monotonic() + 60
    while not any(pids.iterdir()):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the planted hang never started: " + (tmp_path / "sweep.log").read_text()[-2000:])
        time.sleep(0.1)
    return proc


def cache_locks_free(cache: Path) -> bool:
    locks = list(cache.rglob("*.lock"))
    assert locks, "the hung compile took no cache lock"
    for path in locks:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
    return True


@pytest.mark.timeout(90)
def test_sweep_killed_hard_takes_its_worker_and_the_workers_children_along(tmp_path, mark):
    """kill -9 of a sweep during a hung compile (the real worker): the worker, the child its
    compile forked and the group guard all die, and the compile cache entry's lock is free for
    the resumed sweep."""
    proc = start_sweep(tmp_path, mark, real_worker=True)
    os.kill(proc.pid, signal.SIGKILL)  # the sweep alone: nothing else gets a signal from us
    proc.wait()
    assert_none_left(mark)
    assert cache_locks_free(tmp_path / "cache")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sweep_terminated_reaps_its_workers_and_exits_128_plus_the_signal(tmp_path, mark, sig):
    """The worker's children include one that left its group (setsid) and a subprocess."""
    proc = start_sweep(tmp_path, mark, real_worker=False)
    os.kill(proc.pid, sig)
    assert proc.wait(30) == 128 + sig, (tmp_path / "sweep.log").read_text()[-2000:]
    assert_none_left(mark)
    assert (tmp_path / "run" / ".lock").read_text() == ""  # released cleanly, not left stale


@pytest.mark.timeout(60)
def test_a_dead_worker_takes_its_children_along(tmp_path, mark, fake_worker):
    """The worker exits while a forked child (setsid: out of its group, still holding the result
    pipe) and a subprocess live on: the task is FAIL_RUNTIME at once, and both children die."""
    t0 = time.monotonic()
    crash, ok = sweep(tmp_path, ["crash", "ok"], timeout=30)
    assert time.monotonic() - t0 < 15
    assert (crash.status, crash.reason) == ("FAIL_RUNTIME", "worker died (exit 7)")
    assert ok.status == "PASS"  # in a fresh worker
    assert_none_left(mark)


@pytest.mark.timeout(60)
def test_a_cuda_fault_fails_its_task_only(tmp_path, mark, fake_worker):
    """The worker answers a task that lost its CUDA context and then exits: the runner waits for that
    exit instead of handing the next task to the dying worker (which recorded it "worker died (exit 3)")."""
    fault, ok = sweep(tmp_path, ["cuda-fault", "ok"], timeout=30)
    assert (fault.status, fault.reason) == ("FAIL_RUNTIME", "AcceleratorError: CUDA error: an illegal memory access")
    assert (ok.status, ok.reason) == ("PASS", "")
    assert_none_left(mark)


@pytest.mark.timeout(60)
def test_a_worker_past_its_deadline_is_killed_with_its_children(tmp_path, mark, fake_worker):
    t0 = time.monotonic()
    hang, ok = sweep(tmp_path, ["hang", "ok"], timeout=1.5)
    assert time.monotonic() - t0 < 15
    assert hang.status == "TIMEOUT" and ok.status == "PASS"
    assert_none_left(mark)


# --- the result pipe is not trusted -----------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour, reason", [
    ("garbage", "not a result record (JSONDecodeError): 'Traceback (most recent call last): not a record'"),
    ("other-task", "the record of another task (someone|else|cpu|check)"),
    ("close", "closed its result pipe without a result"),
])
def test_a_bad_result_pipe_fails_its_task_only(tmp_path, mark, fake_worker, behaviour, reason):
    t0 = time.monotonic()
    bad, ok = sweep(tmp_path, [behaviour, "ok"], timeout=20)
    assert time.monotonic() - t0 < 15  # a closed pipe waits a short grace for an exit, not --timeout
    assert bad.status == "FAIL_RUNTIME" and reason in bad.reason, bad.reason
    assert ok.status == "PASS"  # the next task got a fresh worker, not the stale one's lines
    assert [r["status"] for r in records(tmp_path / "run")] == ["FAIL_RUNTIME", "PASS"]
    assert_none_left(mark)


@pytest.mark.timeout(60)
def test_a_hang_at_worker_start_costs_the_timeout(tmp_path, mark, fake_worker, monkeypatch):
    fake_worker("hang")
    monkeypatch.setattr(runner, "MIN_STARTUP_S", 0.0, raising=False)  # the floor for slow imports
    t0 = time.monotonic()
    got = sweep(tmp_path, ["ok", "ok"], timeout=1.5)
    assert time.monotonic() - t0 < 12
    assert [(r.status, r.reason) for r in got] == [("FAIL_RUNTIME", "worker did not start within 1.5 s; killed")] * 2
    assert_none_left(mark)


def test_a_worker_that_cannot_be_spawned_is_a_record(tmp_path, mark, monkeypatch):
    monkeypatch.setattr(runner, "WORKER_COMMAND", [str(tmp_path / "no-such-python")], raising=False)
    got = sweep(tmp_path, ["ok", "ok"], timeout=5)
    assert [r.status for r in got] == ["FAIL_RUNTIME"] * 2
    assert got[0].reason.startswith("cannot start a worker: [Errno 2] No such file or directory")
    assert len(records(tmp_path / "run")) == 2
