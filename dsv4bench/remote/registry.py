"""The local record of submitted jobs: one JSON file per job under ~/.local/state/dsv4bench/jobs
(or $DSV4BENCH_STATE_DIR), holding the host's settings as they were at submission."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.remote.config import HostConfig

_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")


class UnknownJob(LookupError):
    pass


@dataclass
class JobRecord:
    id: str
    host: HostConfig
    remote_dir: str
    argv: list[str]
    tree_id: str
    tasks: int = 1  # Slurm array size (shards); 1 on an ssh host
    slurm_id: str | None = None
    submitted: float = dataclasses.field(default_factory=time.time)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "host": dataclasses.asdict(self.host)}

    @classmethod
    def from_json(cls, d: dict) -> "JobRecord":
        host = d["host"]
        return cls(**{**d, "host": HostConfig(**{**host, "sbatch": tuple(host.get("sbatch", ()))})})


def new_job_id() -> str:
    """Sorts by submission time to the millisecond (pruning and listings order by id)."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}-" + secrets.token_hex(3)


def state_dir() -> Path:
    return Path(os.environ.get("DSV4BENCH_STATE_DIR") or "~/.local/state/dsv4bench/jobs").expanduser()


def save(record: JobRecord) -> None:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{record.id}.tmp"
    tmp.write_text(json.dumps(record.to_json(), indent=2))
    tmp.replace(d / f"{record.id}.json")


def load(job_id: str) -> JobRecord:
    """A job by id, or by a unique prefix or suffix of it."""
    matches = [p for p in state_dir().glob("*.json") if job_id and (p.stem.startswith(job_id) or p.stem.endswith(job_id))]
    if len(matches) != 1:
        raise UnknownJob(f"no job '{job_id}' (see `dsv4bench remote status`)" if not matches
                         else f"'{job_id}' matches {len(matches)} jobs")
    return JobRecord.from_json(json.loads(matches[0].read_text()))


def all_jobs() -> list[JobRecord]:
    return [JobRecord.from_json(json.loads(p.read_text())) for p in sorted(state_dir().glob("*.json"))]


def redact(env: dict[str, str]) -> dict[str, str]:
    """Env for display: values of secret-looking names are hidden."""
    return {k: "***" if any(w in k.upper() for w in _SECRET_WORDS) else v for k, v in env.items()}
