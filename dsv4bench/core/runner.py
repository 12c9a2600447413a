"""Plans a sweep's tasks and runs them in an isolated worker process.

Faults are data, not crashes: each task gets a deadline; a worker that misses it is killed (its
own process group only: SIGTERM, then SIGKILL) and the task is recorded as TIMEOUT with the tail
of its log; a worker that dies, cannot be started, or sends something that is not its record is
recorded as FAIL_RUNTIME; the next task starts a fresh worker. Every record is appended to the run
directory as it arrives, so a killed sweep resumes where it stopped when re-run with the same --out.

Worker lifetimes (docs/harness.md, "Guarantees"): a worker is its own process group inside the
sweep's session and dies with the sweep (SIGKILL as the parent-death signal, armed at its start);
what the worker starts dies with the worker (`bind_worker_to_sweep`).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Iterable

from dsv4bench.core.case import Case
from dsv4bench.core.registry import impls
from dsv4bench.core.results import FAIL_RUNTIME, TIMEOUT, ResultRecord, RunDir, task_key

CHECK_IMPL = "torch"  # the impl column of a CPU check record: the low-precision reference in torch
WORKER_COMMAND = [sys.executable, "-m", "dsv4bench.core.worker"]
KILL_GRACE_S = 3.0
TIMINGS = ("events", "graph")  # `sweep --timing`: CUDA events around each call, or around a CUDA graph's replays
DEFAULT_TIMEOUT_S = 300.0  # `sweep --timeout`: a TIMEOUT under a shorter one is not promoted by default
# a worker's start is bounded by --timeout, but never below this: importing torch and the kernel
# modules takes seconds, and a small --timeout must not fail every start
MIN_STARTUP_S = 10.0
POLL_S = 0.25  # how often a wait for the result pipe also checks that the worker is still alive
LOG_TAIL_BYTES = 2000
ENV_RESULT_FD, ENV_SWEEP_PID = "DSV4BENCH_RESULT_FD", "DSV4BENCH_SWEEP_PID"
# a task that failed with one of these left its worker's CUDA context unusable: the worker exits after
# sending the record, and the runner waits for that exit before the next task goes to a fresh worker
CUDA_FATAL_MARKERS = ("illegal memory access", "unspecified launch failure", "CUDA error", "cudaError")


def cuda_context_lost(rec: ResultRecord) -> bool:
    return rec.status == FAIL_RUNTIME and any(mark in rec.reason for mark in CUDA_FATAL_MARKERS)


@dataclass(frozen=True)
class Task:
    case: Case
    impl: str
    arch: str
    mode: str  # compile | check | run
    bench: bool = False
    timing: str = "events"  # how a bench task is timed: TIMINGS
    kernel_split: bool = True  # a bench task also profiles its call's kernels (worker.Worker.kernel_split)

    @property
    def key(self) -> str:
        return task_key(self.case.id, self.impl, self.arch, self.mode)


def plan(cases: Iterable[Case], archs: list[str], gpu: bool, bench: bool, compile_only: bool,
         baselines: list[str] | None = None, only: list[str] | None = None, cpu_check: bool = False,
         timing: str = "events", kernel_split: bool = True) -> list[Task]:
    """GPU: every impl runs (peers too, for ratios). No GPU or `compile_only`: CuTeDSL impls
    compile per arch, nothing runs. `cpu_check` adds, per case, the family's low-precision torch
    reference checked against its FP32 oracle on the CPU. `only` names the impls to run (declared
    variants run only when named there); `baselines` narrows the peers; `timing` (TIMINGS) how bench tasks
    are timed, `kernel_split` whether they profile each call's kernels too."""
    tasks: list[Task] = []
    for case in cases:
        for impl in impls(case.family, variants=only is not None):
            if only is not None and impl.name not in only:
                continue
            if baselines is not None and not impl.compiles and impl.name not in baselines:
                continue
            if gpu and not compile_only:
                arch = archs[0] if impl.compiles else "any"
                tasks.append(Task(case, impl.name, arch, "run", bench, timing, kernel_split))
                continue
            if impl.compiles:
                tasks += [Task(case, impl.name, a, "compile") for a in archs if a in impl.archs]
        if cpu_check:
            tasks.append(Task(case, CHECK_IMPL, "cpu", "check"))
    return tasks


# --- Process lifetimes, the worker's side: called first thing in a worker -----------------------

_PR_SET_PDEATHSIG = 1
_GUARD_SIGNAL = signal.SIGUSR2  # wakes the group guard; nothing else sends it to a worker group
_fork_parent = (0, False)  # (pid, on its main thread) of the process forking now


@cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)  # loaded before any fork: no dlopen in a forked child


def set_parent_death_signal(sig: int) -> bool:
    """Linux: the kernel sends `sig` to this process when the thread that started it exits.
    False where that cannot be asked for."""
    if not sys.platform.startswith("linux"):
        return False
    return _libc().prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(sig)) == 0


def bind_worker_to_sweep() -> None:
    """The worker dies with its sweep, and what it starts dies with it.

    The parent-death signal is armed here, not before exec: a pre-exec hook is unsafe in the
    threaded sweep. A sweep that died before it was armed shows as a changed parent."""
    if not set_parent_death_signal(signal.SIGKILL):
        return
    sweep = int(os.environ.get(ENV_SWEEP_PID, "0"))
    if sweep and os.getppid() != sweep:
        os._exit(1)
    if os.getpgrp() == os.getpid():  # the leader of its own group (as the sweep starts it)
        _fork_group_guard()
    os.register_at_fork(before=_note_fork_parent, after_in_child=_arm_forked_child)


def _fork_group_guard() -> None:
    """Fork a sentinel that SIGKILLs the worker's process group once the worker is gone, however it
    went: the subprocesses compilers and libraries start (their spawn is not ours) die with it."""
    worker = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {_GUARD_SIGNAL})
    if os.fork() == 0:
        try:
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # hold none of the worker's pipes or locks
            if set_parent_death_signal(_GUARD_SIGNAL) and os.getppid() == worker:
                signal.sigwait({_GUARD_SIGNAL})
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {_GUARD_SIGNAL})


def _note_fork_parent() -> None:
    global _fork_parent
    _fork_parent = (os.getpid(), threading.current_thread() is threading.main_thread())


def _arm_forked_child() -> None:
    """A forked child dies with its parent, even after leaving the group (setsid). Only for forks
    of the main thread: the signal fires when the forking thread exits, not the process."""
    parent, on_main = _fork_parent
    if on_main and set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)


# --- The sweep's side -------------------------------------------------------------------------

# its own process group (the one we signal) inside the sweep's session
_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


class WorkerProcess:
    """A worker child; raises OSError when it cannot be spawned."""

    def __init__(self, log_path: Path, env: dict[str, str]):
        self.log_path = log_path
        self._buf = b""
        with ExitStack() as undo:  # a failed spawn leaves no file open
            self.log = undo.enter_context(open(log_path, "ab"))
            r, w = os.pipe()
            self.results = undo.enter_context(os.fdopen(r, "rb", buffering=0))
            try:
                self.proc = subprocess.Popen(
                    WORKER_COMMAND, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                    pass_fds=(w,), env={**env, ENV_RESULT_FD: str(w), ENV_SWEEP_PID: str(os.getpid())},
                    **_OWN_GROUP)
            finally:
                os.close(w)  # the worker holds its own copy
            undo.pop_all()

    def read_line(self, deadline: float) -> str | None:
        """The next non-blank line of the result pipe; None past `deadline` (time.monotonic());
        '' when the worker closed the pipe or exited with no line pending."""
        fd = self.results.fileno()
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.strip():
                    return line.decode(errors="replace")
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if select.select([fd], [], [], min(left, POLL_S))[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return ""
                self._buf += chunk
            elif self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                return ""  # exited; a child it forked may still hold the pipe open

    def send(self, payload: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(payload, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: the read that follows says so

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """TERM, then KILL, to the worker's own process group (children included)."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if self.wait_exit(wait) is not None:
                break
        # children that outlived the leader still hold the group; reap them too
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.close()

    def close(self) -> None:
        for f in (self.proc.stdin, self.results, self.log):
            try:
                f.close()
            except OSError:
                pass


def parse_result(line: str, key: str) -> ResultRecord | str:
    """The worker's record of task `key`, or why `line` is not one."""
    try:
        rec = ResultRecord.from_json(json.loads(line))
    except (ValueError, TypeError, AttributeError) as e:
        return f"the worker sent a line that is not a result record ({type(e).__name__}): {line[:200]!r}"
    if rec.task != key:
        return f"the worker sent the record of another task ({str(rec.task)[:120]})"
    return rec


def log_tail(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(start, os.path.getsize(path) - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _log_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@contextmanager
def exit_on_signals(signals=(signal.SIGTERM, signal.SIGHUP)):
    """SIGTERM and SIGHUP raise SystemExit(128 + signum), so the sweep's `finally` reaps its
    worker before it exits; a second signal gets the default action. A signal the sweep was
    started ignoring (nohup) stays ignored. Main thread only (Python's rule for handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        for s in signals:
            signal.signal(s, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    old = {s: signal.getsignal(s) for s in signals}
    for s, h in old.items():
        if h != signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)


class Runner:
    def __init__(self, run_dir: RunDir, timeout_s: float, gpu: bool):
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self.gpu = gpu
        self.worker: WorkerProcess | None = None
        self.n_workers = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        if not self.gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, tasks: list[Task], on_record: Callable[[ResultRecord], None]) -> None:
        with exit_on_signals():
            try:
                for task in tasks:
                    rec = self._run_one(task)
                    self.run_dir.append(rec)
                    on_record(rec)
            finally:
                self._drop_worker()

    def _drop_worker(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.kill()

    def _ensure_worker(self) -> WorkerProcess | str:
        """The live worker, a fresh one, or why none could be started."""
        if self.worker is not None and self.worker.proc.poll() is None:
            return self.worker
        self._drop_worker()  # died between tasks: reap what it left behind
        self.n_workers += 1
        try:
            self.worker = WorkerProcess(self.run_dir.logs / f"worker-{self.n_workers}.log", self._env())
        except OSError as e:
            return f"cannot start a worker: {e}"
        why = self._await_ready(self.worker)
        if why:
            self._drop_worker()
            return why
        return self.worker

    def _await_ready(self, worker: WorkerProcess) -> str:
        """'' once the worker says it is ready, else why it did not start."""
        limit = max(self.timeout_s, MIN_STARTUP_S)
        line = worker.read_line(time.monotonic() + limit)
        if line is None:
            return f"worker did not start within {limit:g} s; killed"
        if line == "":
            last = log_tail(worker.log_path, 0).strip().splitlines() or ["no output"]
            return "worker failed to start: " + last[-1]
        try:
            ready = json.loads(line) == {"ready": True}
        except ValueError:
            ready = False
        return "" if ready else f"worker failed to start: it sent {line[:200]!r} instead of its ready line"

    def _failed(self, task: Task, status: str, reason: str, log: str) -> ResultRecord:
        return ResultRecord(
            run_id=self.run_dir.run_id, task=task.key, case_id=task.case.id, family=task.case.family,
            impl=task.impl, backend="", arch=task.arch, mode=task.mode, device="cuda" if self.gpu else "cpu",
            params=dict(task.case.params), seed=task.case.seed, origin=task.case.origin,
            status=status, reason=reason, log=log,
        )

    def _run_one(self, task: Task) -> ResultRecord:
        worker = self._ensure_worker()
        if isinstance(worker, str):
            return self._failed(task, FAIL_RUNTIME, worker, "")
        start = _log_size(worker.log_path)
        worker.send({
            "key": task.key, "run_id": self.run_dir.run_id, "case": task.case.to_json(), "impl": task.impl,
            "arch": task.arch, "mode": task.mode, "bench": task.bench, "timing": task.timing,
            "kernel_split": task.kernel_split,
            "device": "cuda" if self.gpu else "cpu",
        })
        line = worker.read_line(time.monotonic() + self.timeout_s)
        if line is None:
            return self._give_up(task, TIMEOUT, f"no result within {self.timeout_s:g} s; worker killed", start)
        if line == "":
            return self._give_up(task, FAIL_RUNTIME, self._why_ended(worker), start)
        rec = parse_result(line, task.key)
        if isinstance(rec, str):  # the pipe's framing is lost: this worker's next line cannot be trusted
            return self._give_up(task, FAIL_RUNTIME, rec + "; worker killed", start)
        if cuda_context_lost(rec):  # it is exiting: the next task must not be sent to it
            worker.wait_exit(KILL_GRACE_S)
            self._drop_worker()
        return rec

    def _why_ended(self, worker: WorkerProcess) -> str:
        """The worker closed its result pipe: it exited, or it lives on and will never answer."""
        code = worker.wait_exit(min(KILL_GRACE_S, self.timeout_s))
        if code is None:
            return "the worker closed its result pipe without a result; worker killed"
        return f"worker died (exit {code})"

    def _give_up(self, task: Task, status: str, reason: str, log_start: int) -> ResultRecord:
        """Kill the current worker (its whole group) and record the task as failed with its log's tail."""
        path = self.worker.log_path
        self._drop_worker()
        return self._failed(task, status, reason, log_tail(path, log_start))
