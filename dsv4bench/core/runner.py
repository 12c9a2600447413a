"""Plans a sweep's tasks and runs them in an isolated worker process.

Faults are data, not crashes: each task gets a deadline; a worker that misses it is killed (its
own process group only: SIGTERM, then SIGKILL) and the task is recorded as TIMEOUT with the tail
of its log; a worker that dies is recorded as FAIL_RUNTIME; the next task starts a fresh worker.
Every record is appended to the run directory as it arrives, so a killed sweep resumes where it
stopped when re-run with the same --out.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from dsv4bench.core.case import Case
from dsv4bench.core.registry import impls
from dsv4bench.core.results import FAIL_RUNTIME, TIMEOUT, ResultRecord, RunDir, task_key

CHECK_IMPL = "torch"  # the impl column of a CPU check record: the low-precision reference in torch
KILL_GRACE_S = 3.0
STARTUP_TIMEOUT_S = 180.0
LOG_TAIL_BYTES = 2000


@dataclass(frozen=True)
class Task:
    case: Case
    impl: str
    arch: str
    mode: str  # compile | check | run
    bench: bool = False

    @property
    def key(self) -> str:
        return task_key(self.case.id, self.impl, self.arch, self.mode)


def plan(cases: Iterable[Case], archs: list[str], gpu: bool, bench: bool, compile_only: bool,
         baselines: list[str] | None = None, only: list[str] | None = None) -> list[Task]:
    """GPU: every impl runs (peers too, for ratios). No GPU: CuTeDSL impls compile per arch and
    the low-precision reference is checked against the oracle on the CPU. `only` names the impls
    to run (declared variants run only when named there); `baselines` narrows the peers."""
    tasks: list[Task] = []
    for case in cases:
        for impl in impls(case.family, variants=only is not None):
            if only is not None and impl.name not in only:
                continue
            if baselines is not None and not impl.compiles and impl.name not in baselines:
                continue
            if gpu and not compile_only:
                arch = archs[0] if impl.compiles else "any"
                tasks.append(Task(case, impl.name, arch, "run", bench))
                continue
            if impl.compiles:
                tasks += [Task(case, impl.name, a, "compile") for a in archs if a in impl.archs]
        if not gpu or compile_only:  # the family's torch low-precision reference vs its oracle
            tasks.append(Task(case, CHECK_IMPL, "cpu", "check"))
    return tasks


class WorkerProcess:
    def __init__(self, log_path: Path, env: dict[str, str]):
        self.log_path = log_path
        r, w = os.pipe()
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4bench.core.worker"],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(w,), env={**env, "DSV4BENCH_RESULT_FD": str(w)},
            start_new_session=True,  # its own process group: we kill it and nothing else
        )
        os.close(w)
        self.results = os.fdopen(r, "r")
        self._buf = ""

    def read_line(self, timeout: float) -> str | None:
        """One line from the result pipe; None on timeout; '' when the worker died."""
        deadline = time.monotonic() + timeout
        while "\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.results], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.results.fileno(), 65536).decode(errors="replace")
                if not chunk:
                    return ""
                self._buf += chunk
        line, self._buf = self._buf.split("\n", 1)
        return line

    def send(self, payload: dict) -> None:
        self.proc.stdin.write((json.dumps(payload, default=str) + "\n").encode())
        self.proc.stdin.flush()

    def kill(self) -> None:
        """TERM, then KILL, to the worker's own process group (children included)."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # children that escaped the leader's death still hold the group; reap them too
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


def log_tail(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(start, os.path.getsize(path) - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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

    def _ensure_worker(self) -> WorkerProcess | str:
        if self.worker is not None and self.worker.proc.poll() is None:
            return self.worker
        self.n_workers += 1
        self.worker = WorkerProcess(self.run_dir.logs / f"worker-{self.n_workers}.log", self._env())
        line = self.worker.read_line(STARTUP_TIMEOUT_S)
        if not line:
            tail = log_tail(self.worker.log_path, 0)
            self.worker.kill()
            self.worker = None
            return "worker failed to start: " + (tail.strip().splitlines() or ["no output"])[-1]
        return self.worker

    def run(self, tasks: list[Task], on_record: Callable[[ResultRecord], None]) -> None:
        try:
            for task in tasks:
                rec = self._run_one(task)
                self.run_dir.append(rec)
                on_record(rec)
        finally:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None

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
        start = os.path.getsize(worker.log_path)
        worker.send({
            "key": task.key, "run_id": self.run_dir.run_id, "case": task.case.to_json(), "impl": task.impl,
            "arch": task.arch, "mode": task.mode, "bench": task.bench, "device": "cuda" if self.gpu else "cpu",
        })
        line = worker.read_line(self.timeout_s)
        if line:
            return ResultRecord.from_json(json.loads(line))
        if line is None:
            worker.kill()
            self.worker = None
            return self._failed(task, TIMEOUT, f"no result within {self.timeout_s:g} s; worker killed",
                                log_tail(worker.log_path, start))
        code = worker.proc.wait()
        self.worker = None
        worker.close()
        return self._failed(task, FAIL_RUNTIME, f"worker died (exit {code})", log_tail(worker.log_path, start))
