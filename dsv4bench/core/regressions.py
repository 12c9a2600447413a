"""Regression memory: the cases that once failed, replayed first in every later sweep of a family.

One checked-in JSONL file per family, `sweeps/regressions/<family>.jsonl`, one line per failing
case (params, seed, status, error summary, commit, date), deduplicated by case id. It is a plain
file, not hypothesis' example database (whose format changes between releases), so it survives
upgrades and reads in review. DSV4BENCH_REGRESSIONS_DIR points elsewhere (tests use a temporary
directory so the suite never dirties the repo).

A sweep only reads that file (it replays it first). The failures a sweep finds go to its run
directory, `<out>/regressions.jsonl`, in the same format; `dsv4bench regressions add RUN`
promotes them to the checked-in file (`promote`), on purpose, never as a side effect of a sweep.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from dsv4bench.core.case import Case
from dsv4bench.core.results import GOOD_STATUSES, TIMEOUT, ResultRecord

ENV_DIR = "DSV4BENCH_REGRESSIONS_DIR"
ORIGIN = "regression"
ERROR_CHARS = 400


def regressions_dir() -> Path:
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override)
    import sweeps

    return Path(sweeps.__file__).resolve().parent / "regressions"


def regression_file(family: str) -> Path:
    return regressions_dir() / f"{family}.jsonl"


def load_entries(family: str) -> list[dict]:
    """The entries of the family's checked-in file, in file order."""
    return read_entries(regression_file(family))


def regression_cases(family: str) -> list[Case]:
    return [Case(family, e["params"], int(e.get("seed", 0)), ORIGIN) for e in load_entries(family)]


def with_regressions(family: str, cases: Iterable[Case]) -> list[Case]:
    """The family's regression cases first, then `cases` without the ones already replayed."""
    ordered: dict[str, Case] = {}
    for case in regression_cases(family):
        ordered.setdefault(case.id, case)  # a duplicated line replays once
    for case in cases:
        ordered.setdefault(case.id, case)
    return list(ordered.values())


def _error_summary(rec: ResultRecord) -> dict:
    worst = {}
    for name, m in (rec.metrics or {}).items():
        if not m.get("passed", True):
            worst[name] = {k: m.get(k) for k in ("max_abs", "bound", "rel_l2", "worst_index") if m.get(k) is not None}
    return {"reason": rec.reason[:ERROR_CHARS], **({"outputs": worst} if worst else {})}


RUN_FILE = "regressions.jsonl"  # a run directory's failures, waiting to be promoted


def read_entries(path: Path) -> list[dict]:
    """The entries of a regression file in file order; unreadable lines are skipped (a hand edit
    gone wrong must not stop a sweep)."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "params" in entry:
            entries.append(entry)
    return entries


def _entry_id(family: str, entry: dict) -> str:
    return Case(family, entry["params"], int(entry.get("seed", 0))).id


def _append(path: Path, entries: list[dict]) -> None:
    if entries:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in entries))


def record_failures(family: str, records: Iterable[ResultRecord], commit: str | None, command: str,
                    path: Path, timeout_s: float | None = None) -> list[str]:
    """Append to `path` (a run directory's RUN_FILE) every failing case of `family` that is
    neither there nor in the checked-in file yet; returns the ids added. `timeout_s` is the
    sweep's --timeout, kept with each entry (a TIMEOUT under a short one may be no bug)."""
    known = {_entry_id(family, e) for e in load_entries(family) + read_entries(path)}
    added: list[dict] = []
    for rec in records:
        if rec.family != family or rec.status in GOOD_STATUSES or rec.case_id in known:
            continue
        known.add(rec.case_id)
        added.append({
            "case_id": rec.case_id, "family": family, "params": rec.params, "seed": rec.seed,
            "status": rec.status, "impl": rec.impl, "arch": rec.arch, "mode": rec.mode,
            "error": _error_summary(rec), "run_id": rec.run_id, "commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            **({"timeout_s": timeout_s} if timeout_s is not None else {}),
        })
    _append(path, added)
    return [e["case_id"] for e in added]


@dataclass
class Promotion:
    family: str
    added: list[str] = field(default_factory=list)
    known: int = 0  # already in the checked-in file
    other_status: int = 0  # left out by the status filter
    short_timeouts: list[float] = field(default_factory=list)  # the --timeout of each TIMEOUT left out


def promote(family: str, entries: list[dict], statuses: set[str] | None, short_timeouts: bool,
            default_timeout_s: float) -> Promotion:
    """Append `entries` (a run's RUN_FILE) to the family's checked-in file: those of `statuses`
    (all when None) not there yet. A TIMEOUT under a --timeout below `default_timeout_s` may only
    mean the limit was short: it is left out unless `short_timeouts`."""
    result = Promotion(family)
    known = {_entry_id(family, e) for e in load_entries(family)}
    chosen = []
    for entry in entries:
        case_id = _entry_id(family, entry)
        timeout_s = entry.get("timeout_s")
        if statuses is not None and entry.get("status") not in statuses:
            result.other_status += 1
        elif case_id in known:
            result.known += 1
        elif (entry.get("status") == TIMEOUT and not short_timeouts and timeout_s is not None
              and float(timeout_s) < default_timeout_s):
            result.short_timeouts.append(float(timeout_s))
        else:
            known.add(case_id)
            chosen.append({**entry, "case_id": case_id})
    _append(regression_file(family), chosen)
    result.added = [e["case_id"] for e in chosen]
    return result
