"""The report's tables as plain rows: pass/fail matrix, failures, performance vs peers, compiles."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from dsv4bench.core.results import GOOD_STATUSES, UNSUPPORTED, ResultRecord
from dsv4bench.report.derived import OURS, error_ratio, rel_l2, roofline, shape
from dsv4bench.report.speedup import is_noisy, ratios

ORIGIN_ORDER = {"regression": 0, "grid": 1, "cli": 2, "hypothesis": 3}
SHORT = {"PASS": "ok", "COMPILED": "ok", "UNSUPPORTED": "n/a", "FAIL_NUMERIC": "num", "FAIL_COMPILE": "cmp",
         "FAIL_RUNTIME": "run", "FAIL_LINT": "lint", "TIMEOUT": "time"}


def status_class(status: str) -> str:
    return {"PASS": "ok", "COMPILED": "ok", "UNSUPPORTED": "na"}.get(status, "bad")


def column(rec: ResultRecord) -> str:
    return f"{rec.impl} {rec.arch} {rec.mode}"


def case_order(records: list[ResultRecord]) -> list[ResultRecord]:
    """One record per case, in sweep order by origin (regressions first), then by params."""
    first: dict[str, ResultRecord] = {}
    for r in records:
        first.setdefault(r.case_id, r)
    return sorted(first.values(), key=lambda r: (ORIGIN_ORDER.get(r.origin, 9), sorted(
        (k, str(v).zfill(12) if isinstance(v, int) else str(v)) for k, v in r.params.items())))


def status_matrix(records: list[ResultRecord]) -> dict:
    """Rows: cases; columns: impl x arch x mode; cells: status (None where not run)."""
    columns = sorted({column(r) for r in records}, key=lambda c: (not c.startswith(OURS), c))
    by_cell = {(r.case_id, column(r)): r for r in records}
    rows = []
    for case in case_order(records):
        cells = []
        for col in columns:
            r = by_cell.get((case.case_id, col))
            cells.append(None if r is None else {"status": r.status, "short": SHORT.get(r.status, r.status),
                                                  "cls": status_class(r.status), "reason": r.reason})
        rows.append({"case_id": case.case_id, "shape": shape(case.params), "origin": case.origin,
                     "seed": case.seed, "cells": cells})
    return {"columns": columns, "rows": rows}


def repro_command(case_id: str, run_path: Path, impl: str | None = None) -> str:
    cmd = ["dsv4bench", "repro", case_id, "--runs", str(run_path.resolve())]
    return shlex.join(cmd + (["--impl", impl] if impl else []))


def failures(records: list[ResultRecord], run_path: Path) -> list[dict]:
    rows = []
    for r in records:
        if r.status in GOOD_STATUSES:
            continue
        ratio = error_ratio(r)
        rows.append({
            "case_id": r.case_id, "shape": shape(r.params), "seed": r.seed, "origin": r.origin, "impl": r.impl,
            "arch": r.arch, "mode": r.mode, "status": r.status, "reason": r.reason, "log": r.log,
            "ratio": ratio, "rel_l2": rel_l2(r),
            "worst": {name: m.get("worst_index") for name, m in (r.metrics or {}).items() if not m.get("passed", True)},
            "repro": repro_command(r.case_id, run_path, r.impl),
        })
    return rows


def perf_rows(records: list[ResultRecord]) -> list[dict]:
    """Timed records, grouped by case, ours first, each peer with its speedup (its ms / ours ms)."""
    timed = [r for r in records if r.timing and r.timing.get("median_ms")]
    vs_ours = {(r.case_id, r.peer): r for r in ratios(records)}
    order = {r.case_id: i for i, r in enumerate(case_order(timed))}
    rows = []
    for r in sorted(timed, key=lambda r: (order[r.case_id], r.backend != OURS, r.impl)):
        t, roof, p = r.timing, roofline(r), r.perf or {}
        rows.append({
            "case_id": r.case_id, "shape": shape(r.params), "impl": r.impl, "arch": r.arch, "ours": r.backend == OURS,
            "median_ms": t["median_ms"], "p10_ms": t.get("p10_ms"), "p90_ms": t.get("p90_ms"), "cv": t.get("cv"),
            "iters": t.get("n"), "retimed": t.get("retimed") or 0, "l2_flush": t.get("l2_flush"), "roof": roof,
            "ratio": vs_ours.get((r.case_id, r.impl)) if r.backend != OURS else None, "noisy": is_noisy(r),
            "pct_same_traffic_copy": p.get("pct_same_traffic_copy"), "kernels_us": p.get("kernels_us") or {},
            "kernels_total_us": p.get("kernels_total_us"), "host_bound": p.get("host_bound"),
        })
    return rows


def speedup_class(v: float | None) -> str:
    """The colour of a speedup cell: green shades where ours is faster, red where slower."""
    if v is None:
        return ""
    return "sp-win2" if v >= 1.25 else "sp-win" if v > 1 else "sp-loss2" if v <= 0.8 else "sp-loss" if v < 1 else ""


def unsupported(records: list[ResultRecord]) -> list[dict]:
    """UNSUPPORTED results grouped by impl and reason, with their count and an example case."""
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        if r.status == UNSUPPORTED:
            groups.setdefault((r.impl, r.reason), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1])))
    return [{"impl": impl, "reason": reason, "count": len(rs), "example": rs[0].case_id,
             "example_shape": shape(rs[0].params)} for (impl, reason), rs in ordered]


def compile_rows(records: list[ResultRecord]) -> list[dict]:
    rows = [{"case_id": r.case_id, "shape": shape(r.params), "impl": r.impl, "arch": r.arch, **r.compile}
            for r in records if r.compile]
    return sorted(rows, key=lambda c: (-(c.get("seconds") or 0.0), c["case_id"]))


def compile_summary(rows: list[dict]) -> dict:
    caches = Counter(c.get("cache") for c in rows)
    return {"count": len(rows), "seconds": sum(c.get("seconds") or 0.0 for c in rows),
            "hits": sum(n for k, n in caches.items() if k != "miss"), "misses": caches.get("miss", 0),
            "spills": sum(1 for c in rows if c.get("local_bytes"))}


def status_counts(records: list[ResultRecord]) -> list[tuple[str, int, str]]:
    counts = Counter(r.status for r in records)
    return [(s, n, status_class(s)) for s, n in sorted(counts.items(), key=lambda kv: (status_class(kv[0]) != "bad", kv[0]))]
