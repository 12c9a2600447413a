"""The end-of-sweep table, peer ratios and the sweep's exit status."""

from __future__ import annotations

from rich.table import Table

from dsv4bench.cli.common import console
from dsv4bench.core.results import (
    FAIL_COMPILE, FAIL_LINT, FAIL_NUMERIC, FAIL_RUNTIME, GOOD_STATUSES, TIMEOUT, ResultRecord, RunDir,
    summarize_statuses,
)

MAX_ROWS = 60
# Exit statuses shared with `dsv4bench remote` (2 is bad input everywhere).
EXIT_CODES = {TIMEOUT: 4, FAIL_RUNTIME: 3, FAIL_COMPILE: 6, FAIL_NUMERIC: 1, FAIL_LINT: 1}
STYLE = {"PASS": "green", "COMPILED": "green", "UNSUPPORTED": "dim"}


def exit_code(records: list[ResultRecord]) -> int:
    present = {r.status for r in records}
    for status in (TIMEOUT, FAIL_RUNTIME, FAIL_COMPILE, FAIL_NUMERIC, FAIL_LINT):
        if status in present:
            return EXIT_CODES[status]
    return 0


def ours_median(records: list[ResultRecord]) -> dict[str, float]:
    """case id -> median ms of our CuTeDSL impl, to express every peer as a ratio of it."""
    return {r.case_id: r.timing["median_ms"] for r in records if r.backend == "cutedsl" and r.timing}


def _err(r: ResultRecord) -> str:
    if not r.metrics:
        return ""
    m = max(r.metrics.values(), key=lambda m: (m.get("max_abs") or 0) / (m.get("bound") or 1e-30))
    if m.get("bound") is None:
        return f"{m.get('mismatches', 0)} diff"
    return f"{m['max_abs']:.2g}/{m['bound']:.2g}"


def _compile(r: ResultRecord) -> str:
    c = r.compile or {}
    if not c:
        return ""
    regs = f" {c['registers']}r" if c.get("registers") else ""
    spill = f" [red]{c['local_bytes']}B local[/]" if c.get("local_bytes") else ""
    return f"{c['seconds']:.2f}s {c.get('cache', '')}{regs}{spill}"


def _pct_same_traffic(perf: dict) -> str:
    """% of a device copy moving the same bytes (records older than that measurement lack it)."""
    return f"{perf['pct_same_traffic_copy']:.1f}" if perf and "pct_same_traffic_copy" in perf else ""


def _kernels_us(perf: dict) -> str:
    """The device µs of the call's kernels (CUPTI), where the event-timed median also holds launch gaps;
    'host-bound' when the median is mostly the GPU waiting for the host."""
    if not perf or "kernels_total_us" not in perf:
        return ""
    return f"{perf['kernels_total_us']:.1f}" + (" [yellow]host-bound[/]" if perf.get("host_bound") else "")


def print_summary(records: list[ResultRecord], run_dir: RunDir) -> None:
    ours = ours_median(records)
    timed = any(r.timing for r in records)
    table = Table(title=f"{len(records)} results in {run_dir.path}")
    columns = ["case", "shape", "impl", "arch", "status", "max err/bound", "compile"]
    columns += ["median ms", "kernels µs", "GB/s", "% copy", "% same-traffic copy", "its time / ours"] if timed else []
    for col in columns:
        table.add_column(col, no_wrap=col in ("case", "status"))
    ordered = sorted(records, key=lambda r: (r.status in GOOD_STATUSES, r.case_id, r.impl))
    for r in ordered[:MAX_ROWS]:
        row = [r.case_id, " ".join(f"{k}={v}" for k, v in r.params.items()), r.impl, r.arch,
               f"[{STYLE.get(r.status, 'red')}]{r.status}[/]", _err(r), _compile(r)]
        if timed:
            t, p = r.timing or {}, r.perf or {}
            ratio = f"{t['median_ms'] / ours[r.case_id]:.2f}x" if t and r.case_id in ours and r.backend != "cutedsl" else ""
            row += [f"{t['median_ms']:.4f}" if t else "", _kernels_us(p), f"{p['gbps']:.0f}" if p else "",
                    f"{p['pct_copy']:.1f}" if p else "", _pct_same_traffic(p), ratio]
        table.add_row(*row)
    if len(ordered) > MAX_ROWS:
        table.caption = f"{len(ordered) - MAX_ROWS} more rows in {run_dir.csv}"
    console.print(table)
    counts = summarize_statuses(records)
    console.print("  ".join(f"[{STYLE.get(s, 'red')}]{s}[/] {n}" for s, n in sorted(counts.items())))
    console.print(f"results: {run_dir.results}\n         {run_dir.csv}")
