"""Regression memory: the cases that once failed, replayed first in every later sweep of a family.

One checked-in JSONL file per family, `sweeps/regressions/<family>.jsonl`, one line per failing
case (params, seed, status, error summary, commit, date), deduplicated by case id. It is a plain
file, not hypothesis' example database (whose format changes between releases), so it survives
upgrades and reads in review. DSV4BENCH_REGRESSIONS_DIR points elsewhere (tests use a temporary
directory so the suite never dirties the repo).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

from dsv4bench.core.case import Case
from dsv4bench.core.results import GOOD_STATUSES, ResultRecord

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
    """The family's entries in file order; unreadable lines are skipped (a hand edit gone wrong
    must not stop a sweep)."""
    path = regression_file(family)
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


def record_failures(family: str, records: Iterable[ResultRecord], commit: str | None, command: str) -> list[str]:
    """Append every failing case of `family` not yet in its file; returns the ids added."""
    known = {Case(family, e["params"], int(e.get("seed", 0))).id for e in load_entries(family)}
    lines, added = [], []
    for rec in records:
        if rec.family != family or rec.status in GOOD_STATUSES or rec.case_id in known:
            continue
        known.add(rec.case_id)
        added.append(rec.case_id)
        lines.append(json.dumps({
            "case_id": rec.case_id, "params": rec.params, "seed": rec.seed, "status": rec.status,
            "impl": rec.impl, "arch": rec.arch, "mode": rec.mode, "error": _error_summary(rec),
            "run_id": rec.run_id, "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command,
        }, sort_keys=True, default=str))
    if lines:
        path = regression_file(family)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
    return added
