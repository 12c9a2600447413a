"""One exit-status taxonomy for remote jobs, shared with `dsv4bench sweep`.

The job's raw facts (the wrapper's `exit` file: return code and seconds, a `cancelled` marker,
whether the wrapper still lives, Slurm's accounting state) become one outcome and one CLI status.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUED, RUNNING = "QUEUED", "RUNNING"
PASS, FAIL_NUMERIC, BAD_INPUT, FAIL_RUNTIME = "PASS", "FAIL_NUMERIC", "BAD_INPUT", "FAIL_RUNTIME"
TIMEOUT, INFRA, FAIL_COMPILE, CANCELLED = "TIMEOUT", "INFRA", "FAIL_COMPILE", "CANCELLED"

# `dsv4bench` exit statuses (cli/summary.py) and the wrapper's own (5: the setup line failed).
EXIT_CODES = {PASS: 0, FAIL_NUMERIC: 1, BAD_INPUT: 2, FAIL_RUNTIME: 3, TIMEOUT: 4, INFRA: 5, FAIL_COMPILE: 6,
              CANCELLED: 130}
_BY_CODE = {code: name for name, code in EXIT_CODES.items()}
TIMEOUT_RCS = (124, 137)  # `timeout` after TERM; KILL after the grace period
# Severity when tasks of one job disagree: the worst one names the job.
SEVERITY = (INFRA, CANCELLED, TIMEOUT, FAIL_RUNTIME, FAIL_COMPILE, FAIL_NUMERIC, BAD_INPUT, PASS)
SLURM_STATES = {
    "PENDING": QUEUED, "CONFIGURING": QUEUED, "REQUEUED": QUEUED, "RUNNING": RUNNING, "COMPLETING": RUNNING,
    "TIMEOUT": TIMEOUT, "DEADLINE": TIMEOUT, "CANCELLED": CANCELLED, "OUT_OF_MEMORY": FAIL_RUNTIME,
    "FAILED": FAIL_RUNTIME, "NODE_FAIL": INFRA, "BOOT_FAIL": INFRA, "PREEMPTED": INFRA, "LAUNCH_FAILED": INFRA,
}


@dataclass(frozen=True)
class TaskFacts:
    name: str
    state: str  # new | queued | running | done (the wrapper's `state` file)
    rc: int | None = None
    elapsed_s: int | None = None
    cancelled: bool = False
    wrapper_alive: bool = False

    @classmethod
    def parse(cls, line: str) -> "TaskFacts":
        """One line of `run.sh state`: NAME<TAB>STATE<TAB>EXIT<TAB>CANCELLED<TAB>ALIVE."""
        name, state, exit_, cancelled, alive = line.split("\t")
        rc = elapsed = None
        if exit_ != "-":
            rc_s, _, el_s = exit_.partition(" ")
            rc, elapsed = int(rc_s), int(el_s or 0)
        return cls(name, state, rc, elapsed, cancelled == "1", alive == "1")


def from_exit(rc: int, elapsed_s: float, timeout_s: float, cancelled: bool) -> str:
    if cancelled:
        return CANCELLED
    if rc in TIMEOUT_RCS and elapsed_s >= timeout_s - 1:
        return TIMEOUT
    if rc in _BY_CODE:
        return _BY_CODE[rc]
    return FAIL_RUNTIME  # a signal (128+N) or an unexpected status


def task_outcome(facts: TaskFacts, timeout_s: float, watch_wrapper: bool, slurm_state: str | None = None) -> str:
    """The outcome of one task. `watch_wrapper`: the wrapper runs where we look (ssh), so a dead
    wrapper without an exit file is an infrastructure failure; under Slurm, accounting says so."""
    slurm = SLURM_STATES.get(slurm_state.split()[0].rstrip("+"), INFRA) if slurm_state else None
    if facts.rc is not None:
        mine = from_exit(facts.rc, facts.elapsed_s or 0, timeout_s, facts.cancelled)
        # Slurm knows why it stopped a task (time limit, scancel, node failure); the wrapper only saw a signal.
        return slurm if mine == FAIL_RUNTIME and slurm in (TIMEOUT, CANCELLED, INFRA) else mine
    if slurm is not None:  # COMPLETED without an exit file maps to INFRA too
        if finished(slurm):
            return slurm
        return RUNNING if RUNNING in (slurm, facts.state.upper()) else QUEUED
    if watch_wrapper and not facts.wrapper_alive and facts.state != "new":  # "new": not started yet
        return INFRA
    return RUNNING if facts.state == "running" else QUEUED


def job_outcome(outcomes: list[str]) -> str:
    """The worst task outcome once every task finished; RUNNING or QUEUED before."""
    pending = [o for o in outcomes if not finished(o)]
    if pending or not outcomes:
        return RUNNING if RUNNING in pending else QUEUED
    return min(outcomes, key=SEVERITY.index)


def finished(outcome: str) -> bool:
    return outcome not in (QUEUED, RUNNING)
