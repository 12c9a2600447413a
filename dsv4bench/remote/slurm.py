"""The Slurm backend's commands, run over the same SSH connection (no shared filesystem assumed):
`sbatch` job arrays (one task per `sweep --shard i/n`), `sacct` for state, `scancel`."""

from __future__ import annotations

import posixpath

from dsv4bench.remote.config import HostConfig
from dsv4bench.remote.ssh import InfraError, Remote


def _bin(host: HostConfig, tool: str) -> str:
    return posixpath.join(host.slurm_bin, tool) if host.slurm_bin else tool


async def submit_array(remote: Remote, job_dir: str, job_id: str, tasks: int) -> str:
    argv = [_bin(remote.host, "sbatch"), "--parsable", f"--array=0-{tasks - 1}", f"--job-name=dsv4bench-{job_id}",
            f"--chdir={job_dir}", f"--output={job_dir}/slurm-%a.out", "--signal=B:TERM@60",
            *remote.host.sbatch, posixpath.join(job_dir, "run.sh"), "run"]
    out = (await remote.run(argv)).stdout.strip()
    slurm_id = out.split(";")[0]
    if not slurm_id.isdigit():
        raise InfraError(f"{remote.host.name}: sbatch printed no job id: {out[:200]!r}")
    return slurm_id


async def task_states(remote: Remote, slurm_id: str) -> dict[int, str]:
    """Array task index -> Slurm state (PENDING, RUNNING, COMPLETED, TIMEOUT, CANCELLED by ..., ...)."""
    argv = [_bin(remote.host, "sacct"), "-j", slurm_id, "-P", "-n", "-X", "--format=JobID,State,ExitCode"]
    states: dict[int, str] = {}
    for line in (await remote.run(argv)).stdout.splitlines():
        job, _, rest = line.partition("|")
        base, _, index = job.partition("_")
        if base == slurm_id and index.isdigit():
            states[int(index)] = rest.split("|")[0]
    return states


async def cancel(remote: Remote, slurm_id: str) -> None:
    await remote.run([_bin(remote.host, "scancel"), slurm_id])
