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

from dsv4bench.remote.config import ConfigError, HostConfig, parse_host

_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")


class UnknownJob(LookupError):
    """No such job here: one line, exit status 2."""


class CorruptJob(UnknownJob):
    """A job file that cannot be read back: reported, as an unknown job is, with the file's path."""


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
    def from_json(cls, d: dict, where: str = "job record") -> "JobRecord":
        """Raises ConfigError, KeyError or TypeError for a record that is not one."""
        host = {k: v for k, v in d["host"].items() if v is not None}  # None: a setting left unset
        record = cls(**{**d, "host": parse_host(host.pop("name"), host, where, Path("/"))})
        for name, kind in _FIELD_TYPES.items():
            if not isinstance(getattr(record, name), kind):
                raise TypeError(f"{name} is {getattr(record, name)!r:.40}")
        return record


_FIELD_TYPES = {"id": str, "remote_dir": str, "argv": list, "tree_id": str, "tasks": int,
                "slurm_id": (str, type(None)), "submitted": (int, float)}


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
    return _read(matches[0])


def all_jobs() -> list[JobRecord]:
    return [_read(p) for p in sorted(state_dir().glob("*.json"))]


def _read(path: Path) -> JobRecord:
    try:
        return JobRecord.from_json(json.loads(path.read_text()), where=f"job file {path}")
    except ConfigError as e:
        raise CorruptJob(f"corrupt {e}") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:  # ValueError: not UTF-8, not JSON
        detail = f"no key {e}" if isinstance(e, KeyError) else str(e)
        raise CorruptJob(f"corrupt job file {path}: {detail}") from None


def redact(env: dict[str, str]) -> dict[str, str]:
    """Env for display: values of secret-looking names are hidden."""
    return {k: "***" if any(w in k.upper() for w in _SECRET_WORDS) else v for k, v in env.items()}
