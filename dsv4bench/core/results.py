"""Result records and run directories.

A run directory holds `run.json` (what ran, where, with which versions), `results.jsonl`
(append-only, one ResultRecord per line, flushed and fsynced per record so an interrupted run
loses nothing), `results.csv` (flat, unit-suffixed columns, full precision, rebuilt from the
JSONL) and `logs/` (worker logs). Re-running with the same directory skips finished tasks.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

PASS, COMPILED = "PASS", "COMPILED"
FAIL_NUMERIC, FAIL_COMPILE, FAIL_RUNTIME, FAIL_LINT = "FAIL_NUMERIC", "FAIL_COMPILE", "FAIL_RUNTIME", "FAIL_LINT"
TIMEOUT, UNSUPPORTED = "TIMEOUT", "UNSUPPORTED"
STATUSES = (PASS, COMPILED, FAIL_NUMERIC, FAIL_COMPILE, FAIL_RUNTIME, FAIL_LINT, TIMEOUT, UNSUPPORTED)
GOOD_STATUSES = (PASS, COMPILED, UNSUPPORTED)


@dataclass
class ResultRecord:
    run_id: str
    task: str  # "<case_id>|<impl>|<arch>|<mode>": the unit of resume
    case_id: str
    family: str
    impl: str
    backend: str
    arch: str
    mode: str  # compile | check | run
    device: str
    params: dict
    seed: int
    origin: str
    status: str
    reason: str = ""
    metrics: dict = field(default_factory=dict)  # output name -> ErrorMetrics json
    timing: dict | None = None  # TimingStats json
    perf: dict | None = None  # tflops, gbps, pct_copy, pct_gemm
    compile: dict | None = None  # seconds, cubin_bytes, registers, local_bytes, ..., cache
    log: str = ""
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ResultRecord":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def task_key(case_id: str, impl: str, arch: str, mode: str) -> str:
    return f"{case_id}|{impl}|{arch}|{mode}"


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.results = self.path / "results.jsonl"
        self.csv = self.path / "results.csv"
        self.meta = self.path / "run.json"
        self.logs = self.path / "logs"

    @property
    def run_id(self) -> str:
        return self.path.name

    def create(self) -> "RunDir":
        """Create (or reopen) the directory; raises OSError when it cannot be written."""
        self.logs.mkdir(parents=True, exist_ok=True)
        probe = self.path / ".write-probe"
        probe.write_text("")
        probe.unlink()
        return self

    def write_meta(self, meta: dict[str, Any]) -> None:
        old = self.read_meta()
        runs = old.get("invocations", []) + [meta]
        tmp = self.meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({**old, **meta, "invocations": runs}, indent=2, default=str))
        tmp.replace(self.meta)

    def read_meta(self) -> dict:
        return json.loads(self.meta.read_text()) if self.meta.exists() else {}

    def append(self, record: ResultRecord) -> None:
        line = json.dumps(record.to_json(), default=str)
        with open(self.results, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[ResultRecord]:
        if not self.results.exists():
            return []
        out = []
        for line in self.results.read_text().splitlines():
            if not line.strip():
                continue
            try:
                out.append(ResultRecord.from_json(json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue  # a line cut by a kill mid-write; the task reruns
        return out

    def done_tasks(self) -> set[str]:
        return {r.task for r in self.records()}

    def write_csv(self) -> Path:
        rows = [flatten(r) for r in self.records()]
        columns: list[str] = []
        for row in rows:
            columns += [c for c in row if c not in columns]
        tmp = self.csv.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(self.csv)
        return self.csv


# Column names carry their unit; floats are written with repr() so the CSV round-trips exactly.
_UNITS = {
    "median_ms": "median_ms", "p10_ms": "p10_ms", "p90_ms": "p90_ms", "mean_ms": "mean_ms",
    "cv": "cv", "n": "iters", "l2_flush": "l2_flush",
}


def flatten(r: ResultRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": r.run_id, "case_id": r.case_id, "family": r.family, "impl": r.impl,
        "backend": r.backend, "arch": r.arch, "mode": r.mode, "device": r.device,
        "status": r.status, "seed": r.seed, "origin": r.origin, "reason": r.reason,
    }
    for k, v in r.params.items():
        row[f"param_{k}"] = v
    for out, m in (r.metrics or {}).items():
        for k in ("max_abs", "mean_abs", "rel_l2", "bound", "lowprec_max_abs", "mismatches"):
            if m.get(k) is not None:
                row[f"err_{out}_{k}"] = m[k]
        if m.get("worst_index") is not None:
            row[f"err_{out}_worst_index"] = json.dumps(m["worst_index"])
    if r.timing:
        for k, col in _UNITS.items():
            row[f"time_{col}"] = r.timing.get(k)
    if r.perf:
        for k, v in r.perf.items():
            row[f"perf_{k}"] = v
    if r.compile:
        for k, v in r.compile.items():
            row[f"compile_{k}"] = v
    return {k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()}


def summarize_statuses(records: Iterable[ResultRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts
