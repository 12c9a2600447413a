"""The job lifecycle, common to the ssh and slurm backends: submit, status, cancel, fetch.

On the host, under the configured workdir:
    trees/<tree_id>/   the packed working tree, extracted once and shared by every job that uses it
    locks/<gpuN|host>.lock   the per-GPU lock the wrapper takes before it runs anything
    jobs/<job_id>/     run.sh (the wrapper), job.env (argv, env, timeouts; all values quoted),
                       job.json, and per task: pid, pgid (each with a .stime: the process's start time), state,
                       exit, cancelled, finish.lock, output.log, out/
                       (the command's working directory). Slurm tasks use jobs/<job_id>/task-<i>/.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dsv4bench.remote import outcome, slurm
from dsv4bench.remote.config import HostConfig
from dsv4bench.remote.outcome import TaskFacts
from dsv4bench.remote.packing import Pack
from dsv4bench.remote.registry import JobRecord, new_job_id, redact, save
from dsv4bench.remote.ssh import InfraError, Remote


START_GRACE_S = 60  # a wrapper that has not written its pid by then never started (see wrapper.log)
TREE_MIN_AGE_MIN = 60


@dataclass(frozen=True)
class JobStatus:
    outcome: str
    tasks: dict[str, str]  # task name -> outcome

    @property
    def exit_code(self) -> int:
        return outcome.EXIT_CODES.get(self.outcome, 0)


def wrapper_script() -> bytes:
    return resources.files("dsv4bench.remote").joinpath("run_job.sh").read_bytes()


def job_env(host: HostConfig, tree_dir: str, lock_file: str, argv: list[str], tasks: int, commit: str = "") -> str:
    q = shlex.quote
    lines = [f"{k}={q(str(v))}" for k, v in dict(
        BACKEND=host.backend, SETUP=host.setup, PYTHON=host.python, TIMEOUT_S=host.timeout_s,
        GRACE_S=host.kill_grace_s, LOCK_FILE=lock_file, SHARDS=tasks).items()]
    lines.append(f"export PYTHONPATH={q(tree_dir)}${{PYTHONPATH:+:$PYTHONPATH}}")
    if commit:  # the shipped tree has no .git: run.json takes the commit from here
        lines.append(f"export DSV4BENCH_COMMIT={q(commit)}")
    lines += [f"export {k}={q(v)}" for k, v in host.job_env().items()]
    lines.append("set -- " + " ".join(q(a) for a in argv))
    return "\n".join(lines) + "\n"


def commit_label(manifest: dict) -> str:
    commit = (manifest.get("commit") or "")[:12]
    return commit + ("-dirty" if commit and manifest.get("dirty") else "")


async def ensure_tree(remote: Remote, pack: Pack) -> tuple[str, bool]:
    """Make trees/<tree_id>/ exist on the host; returns its path and whether the tarball was sent."""
    tree = remote.path("trees", pack.tree_id)
    if await remote.exists(posixpath.join(tree, ".complete")):
        await remote.touch(tree)  # in use again: not stale for `prune`
        return tree, False
    staging = f"{tree}.{new_job_id()}"  # unique: another submit may be sending the same tree
    blob = staging + ".tar.gz"
    await remote.write(blob, pack.data)
    script = ('set -e; mkdir -p "$2"; tar -xzf "$1" -C "$2"; : > "$2/.complete"; '
              'mv -T "$2" "$3" 2>/dev/null || rm -rf -- "$2"; rm -f -- "$1"')
    await remote.run(["bash", "-c", script, "extract", blob, staging, tree])
    return tree, True


async def submit(host: HostConfig, pack: Pack, argv: list[str], tasks: int = 1) -> tuple[JobRecord, bool]:
    """Upload the tree (unless the host has it), write the job directory, launch detached.
    Returns the job record and whether the tree was sent."""
    job_id = new_job_id()
    async with Remote(host) as remote:
        for sub in ("jobs", "trees", "locks"):
            await remote.makedirs(remote.path(sub))
        tree, sent = await ensure_tree(remote, pack)
        job_dir = remote.path("jobs", job_id)
        await remote.makedirs(job_dir)
        lock = remote.path("locks", f"{host.lock_name}.lock") if host.gpu_lock and host.backend == "ssh" else ""
        record = JobRecord(id=job_id, host=host, remote_dir=job_dir, argv=argv, tree_id=pack.tree_id, tasks=tasks)
        meta = {"id": job_id, "host": host.name, "argv": argv, "env": redact(host.job_env()),
                "tree": {**pack.manifest, "tree_id": pack.tree_id}, "submitted": time.time(), "tasks": tasks}
        await remote.write(posixpath.join(job_dir, "job.json"), json.dumps(meta, indent=2).encode())
        await remote.write(posixpath.join(job_dir, "job.env"), job_env(host, tree, lock, argv, tasks, commit_label(pack.manifest)).encode())
        await remote.write(posixpath.join(job_dir, "run.sh"), wrapper_script(), mode=0o700)
        if host.backend == "slurm":
            record.slurm_id = await slurm.submit_array(remote, job_dir, job_id, tasks)
        else:
            await remote.launch(["setsid", "bash", "run.sh", "run"], cwd=job_dir,
                                log=posixpath.join(job_dir, "wrapper.log"))
        save(record)
        await prune(remote, keep=host.keep_jobs, current=job_id)
    return record, sent


async def prune(remote: Remote, keep: int, current: str) -> None:
    """Remove the oldest finished job directories beyond `keep` (ids sort by time), then the trees
    that no remaining job uses and that were not extracted in the last TREE_MIN_AGE_MIN (a submit
    running beside this one may have just extracted its tree)."""
    jobs = sorted(n for n in await remote.listdir(remote.path("jobs")) if n != current)
    old = jobs[:max(0, len(jobs) - keep)]
    done = {n for n in old if await remote.exists(remote.path("jobs", n, "exit"))
            or await remote.exists(remote.path("jobs", n, "task-0", "exit"))}
    used = set()
    for n in [*jobs, current]:
        if n not in done:
            meta = await remote.read_from(remote.path("jobs", n, "job.json"), 0)
            used.add(json.loads(meta or b"{}").get("tree", {}).get("tree_id"))
    trees = remote.path("trees")
    settled = (await remote.run(["find", trees, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-mmin",
                                 f"+{TREE_MIN_AGE_MIN}", "-printf", "%f\\n"])).stdout.split()
    stale = [posixpath.join(trees, n) for n in settled if "." not in n and n not in used]  # "." : staging
    doomed = [remote.path("jobs", n) for n in sorted(done)] + stale
    if doomed:
        await remote.run(["rm", "-rf", "--", *doomed])


async def task_facts(remote: Remote, record: JobRecord) -> list[TaskFacts]:
    out = (await remote.run(["bash", "run.sh", "state"], cwd=record.remote_dir)).stdout
    return [TaskFacts.parse(line) for line in out.splitlines() if line.strip()]


async def status(remote: Remote, record: JobRecord) -> JobStatus:
    # Slurm's view first, then the task files: a task Slurm calls COMPLETED has written its exit file.
    states = await slurm.task_states(remote, record.slurm_id) if record.slurm_id else {}
    facts = {f.name: f for f in await task_facts(remote, record)}
    timeout_s = record.host.timeout_s
    if record.slurm_id is None:
        never_started = time.time() - record.submitted > START_GRACE_S
        tasks = {name: outcome.INFRA if f.state == "new" and never_started
                 else outcome.task_outcome(f, timeout_s, watch_wrapper=True) for name, f in facts.items()}
    else:
        tasks = {}
        for i in range(record.tasks):
            name = f"task-{i}"
            f = facts.get(name, TaskFacts(name, "new"))
            tasks[name] = outcome.task_outcome(f, timeout_s, watch_wrapper=False, slurm_state=states.get(i, "PENDING"))
    return JobStatus(outcome.job_outcome(list(tasks.values())), tasks)


async def cancel(remote: Remote, record: JobRecord) -> list[str]:
    """Stop the job unless it has finished (TERM, then KILL, its process group and session; Slurm:
    scancel); returns the wrapper's report lines."""
    result = await remote.run(["bash", "run.sh", "cancel"], cwd=record.remote_dir,
                              timeout=record.host.kill_grace_s + 60)
    if record.slurm_id is not None and not outcome.finished((await status(remote, record)).outcome):
        await slurm.cancel(remote, record.slurm_id)
    return [line for line in result.stdout.splitlines() if line.strip()]


def log_path(record: JobRecord, task: int | None) -> str:
    if record.slurm_id is None:
        return posixpath.join(record.remote_dir, "output.log")
    return posixpath.join(record.remote_dir, f"task-{task or 0}", "output.log")


async def fetch(remote: Remote, record: JobRecord, dest: Path) -> list[Path]:
    """Mirror the job directory into `dest`, less job.env (its env values may be secrets);
    returns the files written."""
    files = await remote.download_tree(record.remote_dir, dest, skip=frozenset({"job.env"}))
    if not files:
        raise InfraError(f"job {record.id}: nothing to fetch in {record.remote_dir}")
    return files
