"""Result records and run directories.

A run directory holds `run.json` (what ran, where, with which versions), `results.jsonl`
(append-only, one ResultRecord per line, flushed and fsynced per record so an interrupted run
loses nothing; a run committed under benchmarks/results keeps it gzipped as `results.jsonl.gz`,
read alike), `results.csv` (flat, unit-suffixed columns, full precision, rebuilt from the
JSONL, read back losslessly by `read_csv`) and `logs/` (worker logs). Re-running with the same directory skips finished tasks.

One writer at a time: `RunDir.create` takes `.lock` (an flock held while the RunDir lives; the
kernel drops it when the process dies) and refuses, naming the holder, while another process has it.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import gzip
import json
import os
import socket
import sys
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

PASS, COMPILED = "PASS", "COMPILED"
# a knock-out variant (Impl.checked False): it ran and was timed; its output is not an answer
UNCHECKED = "UNCHECKED"
FAIL_NUMERIC, FAIL_COMPILE, FAIL_RUNTIME, FAIL_LINT = "FAIL_NUMERIC", "FAIL_COMPILE", "FAIL_RUNTIME", "FAIL_LINT"
TIMEOUT, UNSUPPORTED = "TIMEOUT", "UNSUPPORTED"
STATUSES = (PASS, COMPILED, UNCHECKED, FAIL_NUMERIC, FAIL_COMPILE, FAIL_RUNTIME, FAIL_LINT, TIMEOUT, UNSUPPORTED)
GOOD_STATUSES = (PASS, COMPILED, UNCHECKED, UNSUPPORTED)


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
    perf: dict | None = None  # tflops, gbps, pct_copy, pct_same_traffic_copy, pct_gemm
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


def _last_newline(f, end: int, block: int = 1 << 16) -> int:
    """The offset of the last b"\\n" in binary file `f` of size `end`, -1 when it has none."""
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at
        end = start
    return -1


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class RunDirBusy(OSError):
    """Another live process writes the run directory; the message names it (one line)."""


class _DirLock:
    """An exclusive flock on a run directory's lock file, with who holds it written inside (the
    flock is the lock; the text only names the holder). Released when the object is collected or
    the process exits, by the kernel when the process dies."""

    def __init__(self, path: Path):
        self.file = open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.file.read()
            self.file.close()
            raise RunDirBusy(errno.EBUSY, f"another sweep is writing it ({describe_holder(holder)})") from None
        stale = self.file.read()
        if stale.strip():  # left by a process that died holding it: a clean release empties it
            print(f"dsv4bench: {path.parent}: taking over the lock of a sweep that is gone "
                  f"({describe_holder(stale)})", file=sys.stderr, flush=True)
        self.file.seek(0)
        self.file.truncate()
        self.file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                    "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        self.file.flush()
        weakref.finalize(self, _release, self.file)


def _release(f) -> None:
    try:
        f.truncate(0)  # empty: a clean release, not a stale holder
        f.close()
    except (OSError, ValueError):
        pass


def describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']}, started {h['started']}"
    except (ValueError, TypeError, KeyError):
        return "holder unknown"


# one lock per directory per process: a second RunDir of the same directory shares it
_HELD: "weakref.WeakValueDictionary[str, _DirLock]" = weakref.WeakValueDictionary()


class RunDir:
    LOCK = ".lock"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.results = self.path / "results.jsonl"
        self.archive = self.path / "results.jsonl.gz"  # a committed run (benchmarks/save_run.py): read-only
        self.csv = self.path / "results.csv"
        self.meta = self.path / "run.json"
        self.logs = self.path / "logs"
        self._lock: _DirLock | None = None
        self._tail_checked = False

    @property
    def run_id(self) -> str:
        return self.path.name

    def create(self) -> "RunDir":
        """Create (or reopen) the directory and hold its lock while this RunDir lives; raises OSError
        when it cannot be written, RunDirBusy (an OSError) while another process holds it."""
        self.logs.mkdir(parents=True, exist_ok=True)
        probe = self.path / ".write-probe"
        probe.write_text("")
        probe.unlink()
        self.lock()
        self.repair_tail()
        return self

    def lock(self) -> None:
        key = os.path.realpath(self.path)
        self._lock = _HELD.get(key) or _DirLock(self.path / self.LOCK)
        _HELD[key] = self._lock

    def repair_tail(self) -> None:
        """Cut a torn last line of results.jsonl (a crash mid-write), saying so, so that the next
        record starts a line of its own; a complete record missing only its newline gets one."""
        self._tail_checked = True
        try:
            f = open(self.results, "rb+")
        except FileNotFoundError:
            return
        with f:
            keep = _last_newline(f, f.seek(0, os.SEEK_END)) + 1
            f.seek(keep)
            tail = f.read()
            if not tail:
                return
            if _is_record(tail):
                f.write(b"\n")  # at the end, where the read left off
                return
            f.truncate(keep)
        print(f"dsv4bench: {self.results}: dropped a torn last line ({len(tail)} bytes, cut by a crash "
              f"mid-write); its task runs again", file=sys.stderr, flush=True)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Merge `meta` into run.json; each invocation is logged too, without the (large) case table."""
        old = self.read_meta()
        runs = old.get("invocations", []) + [{k: v for k, v in meta.items() if k != "cases"}]
        tmp = self.meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({**old, **meta, "invocations": runs}, indent=2, default=str))
        tmp.replace(self.meta)

    def read_meta(self) -> dict:
        return json.loads(self.meta.read_text()) if self.meta.exists() else {}

    def append(self, record: ResultRecord) -> None:
        if not self._tail_checked:
            self.repair_tail()
        line = json.dumps(record.to_json(), default=str)
        with open(self.results, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    @property
    def has_records(self) -> bool:
        return self.results.exists() or self.archive.exists()

    def _lines(self) -> list[str]:
        if self.results.exists():
            return self.results.read_text().splitlines()
        if self.archive.exists():
            return gzip.decompress(self.archive.read_bytes()).decode().splitlines()
        return []

    def records(self) -> list[ResultRecord]:
        """The run's records: results.jsonl, else the gzipped results.jsonl.gz of a committed run."""
        out = []
        for line in self._lines():
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


# results.csv: one row per record, every field of it, so the CSV round-trips to the JSONL exactly.
# Nested fields become `<group>.<key>` columns (param.m, err.out.max_abs, time.median_ms,
# perf.tflops, compile.seconds); keys without a unit get one (time.n -> time.iters). Cells hold
# str(int), repr(float) (shortest exact form), True/False, null for None, JSON for lists and
# dicts; a string that would read back as anything else is written JSON-quoted. An empty cell
# is the empty string in a top-level column and "no such key in this record" in a nested one.
# Top-level `time` and `mode` get CSV names of their own: `time` sat beside the time.* timing
# columns and `mode` shadows pandas' DataFrame.mode. CSVs with the old names still read back.
_GROUPS = (("params", "param"), ("timing", "time"), ("perf", "perf"), ("compile", "compile"))
_RENAME = {"time.n": "time.iters", "time": "recorded_at_epoch_s", "mode": "task_mode"}
_UNRENAME = {v: k for k, v in _RENAME.items()}


def _decode(cell: str) -> Any:
    if cell == "":
        return cell
    if cell == "null":
        return None
    if cell in ("True", "False"):
        return cell == "True"
    for parse in (int, float):
        try:
            return parse(cell)
        except ValueError:
            pass
    if cell[:1] in ('"', "[", "{"):
        try:
            return json.loads(cell)
        except json.JSONDecodeError:
            pass
    return cell


def _encode(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, (bool, int)):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v if _decode(v) == v else json.dumps(v)
    return json.dumps(v)


def flatten(r: ResultRecord) -> dict[str, str]:
    """Top-level fields first, then the nested groups."""
    d = r.to_json()
    top = {_RENAME.get(k, k): _encode(v) for k, v in d.items() if k != "metrics" and k not in dict(_GROUPS)}
    nested: dict[str, Any] = {}
    for name, prefix in _GROUPS[:1]:
        nested.update({f"{prefix}.{k}": v for k, v in (d[name] or {}).items()})
    for out, m in (d["metrics"] or {}).items():
        nested.update({f"err.{out}.{k}": v for k, v in m.items()})
    for name, prefix in _GROUPS[1:]:
        nested.update({f"{prefix}.{k}": v for k, v in (d[name] or {}).items()})
    # an empty nested cell means "absent", so an empty string there is written quoted
    return {**top, **{_RENAME.get(k, k): _encode(v) or '""' for k, v in nested.items()}}


def unflatten(row: dict[str, str]) -> ResultRecord:
    d: dict[str, Any] = {"metrics": {}, "params": {}}
    groups = {prefix: name for name, prefix in _GROUPS}
    for col, cell in row.items():
        col = _UNRENAME.get(col, col)
        head, dot, rest = col.partition(".")
        if not dot:
            d[col] = _decode(cell or "")
        elif not cell:
            continue  # no such key in this record
        elif head == "err":
            out, _, key = rest.rpartition(".")
            d["metrics"].setdefault(out, {})[key] = _decode(cell)
        else:
            d.setdefault(groups[head], {})[rest] = _decode(cell)
    return ResultRecord.from_json(d)


def read_csv(path: str | os.PathLike) -> list[ResultRecord]:
    with open(path, newline="") as f:
        return [unflatten(row) for row in csv.DictReader(f)]


def summarize_statuses(records: Iterable[ResultRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts
