"""A run directory read back for reporting: its metadata and its records, validated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4bench.core.results import ResultRecord, RunDir


class NotARunDir(Exception):
    """The path is missing or holds no sweep results (one line for the user, exit 2)."""


@dataclass
class Run:
    dir: RunDir
    meta: dict
    records: list[ResultRecord]

    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def environment(self) -> dict:
        return self.meta.get("environment") or {}


def load_run(path: str | Path) -> Run:
    run_dir = RunDir(path)
    if not run_dir.path.exists():
        raise NotARunDir(f"run directory {run_dir.path} does not exist")
    if not run_dir.path.is_dir():
        raise NotARunDir(f"{run_dir.path} is not a directory")
    if not run_dir.has_records and not run_dir.meta.exists():
        raise NotARunDir(f"{run_dir.path} is not a run directory (no results.jsonl(.gz) or run.json in it)")
    return Run(run_dir, read_meta(run_dir), run_dir.records())


def read_meta(run_dir: RunDir) -> dict:
    """run.json as a dict ({} when absent); NotARunDir naming the file when it is not a JSON object."""
    try:
        meta = run_dir.read_meta()
    except ValueError as e:
        raise NotARunDir(f"{run_dir.meta} is not valid JSON: {e}") from None
    except OSError as e:
        raise NotARunDir(f"cannot read {run_dir.meta}: {e.strerror or e}") from None
    if not isinstance(meta, dict):
        raise NotARunDir(f"{run_dir.meta} holds a JSON {type(meta).__name__}, not the object a sweep writes")
    return meta
