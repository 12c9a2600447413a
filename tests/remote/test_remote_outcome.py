"""The job's raw facts map to one outcome of the shared taxonomy."""

from __future__ import annotations

import pytest

from dsv4bench.remote import outcome
from dsv4bench.remote.outcome import TaskFacts, job_outcome, task_outcome

T = "task-0"


@pytest.mark.parametrize("facts, want", [
    (TaskFacts(T, "new"), outcome.QUEUED),  # the wrapper has not written its pid yet
    (TaskFacts(T, "queued", wrapper_alive=True), outcome.QUEUED),
    (TaskFacts(T, "running", wrapper_alive=True), outcome.RUNNING),
    (TaskFacts(T, "running"), outcome.INFRA),  # the wrapper died without an exit status
    (TaskFacts(T, "done", rc=124, elapsed_s=60), outcome.TIMEOUT),
    (TaskFacts(T, "done", rc=137, elapsed_s=61), outcome.TIMEOUT),  # KILL after the grace period
    (TaskFacts(T, "done", rc=137, elapsed_s=5), outcome.FAIL_RUNTIME),  # killed early: OOM, not the timeout
    (TaskFacts(T, "done", rc=143, elapsed_s=5, cancelled=True), outcome.CANCELLED),
    (TaskFacts(T, "done", rc=5, elapsed_s=0), outcome.INFRA),  # the setup line failed
    (TaskFacts(T, "done", rc=6, elapsed_s=9), outcome.FAIL_COMPILE),
])
def test_ssh_task_outcomes(facts, want):
    assert task_outcome(facts, timeout_s=60, watch_wrapper=True) == want


@pytest.mark.parametrize("slurm, facts, want", [
    ("PENDING", TaskFacts("task-0", "new"), outcome.QUEUED),
    ("RUNNING", TaskFacts("task-0", "queued"), outcome.RUNNING),
    ("TIMEOUT", TaskFacts("task-0", "running"), outcome.TIMEOUT),
    ("CANCELLED by 1000", TaskFacts("task-0", "running"), outcome.CANCELLED),
    ("TIMEOUT", TaskFacts("task-0", "done", rc=143, elapsed_s=5), outcome.TIMEOUT),  # --signal=B:TERM before the limit
    ("OUT_OF_MEMORY", TaskFacts("task-0", "running"), outcome.FAIL_RUNTIME),
    ("NODE_FAIL", TaskFacts("task-0", "running"), outcome.INFRA),
    ("COMPLETED", TaskFacts("task-0", "running"), outcome.INFRA),  # ended without the wrapper's exit file
    ("COMPLETED", TaskFacts("task-0", "done", rc=6, elapsed_s=3), outcome.FAIL_COMPILE),
])
def test_slurm_task_outcomes(slurm, facts, want):
    assert task_outcome(facts, timeout_s=60, watch_wrapper=False, slurm_state=slurm) == want


@pytest.mark.parametrize("tasks, want", [
    ([outcome.PASS, outcome.RUNNING, outcome.FAIL_COMPILE], outcome.RUNNING),  # not over until every task is
    ([outcome.QUEUED, outcome.PASS], outcome.QUEUED),
    ([outcome.PASS, outcome.FAIL_NUMERIC, outcome.FAIL_COMPILE], outcome.FAIL_COMPILE),
    ([outcome.TIMEOUT, outcome.FAIL_RUNTIME, outcome.PASS], outcome.TIMEOUT),
    ([outcome.PASS] * 4, outcome.PASS),
])
def test_job_outcome_is_the_worst_finished_task(tasks, want):
    assert job_outcome(tasks) == want
