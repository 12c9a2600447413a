"""The end-of-sweep table, peer ratios and the sweep's exit status."""

from __future__ import annotations

from rich.table import Table

from dsv4bench.cli.common import console
from dsv4bench.core.results import (
    FAIL_COMPILE, FAIL_LINT, FAIL_NUMERIC, FAIL_RUNTIME, GOOD_STATUSES, TIMEOUT, ResultRecord, RunDir,
    summarize_statuses,
)
from dsv4bench.report.speedup import NOISY_CV, Ratio, Speed, Stats, describe, ratios, speed

MAX_ROWS = 60
# Exit statuses shared with `dsv4bench remote` (2 is bad input everywhere).
EXIT_CODES = {TIMEOUT: 4, FAIL_RUNTIME: 3, FAIL_COMPILE: 6, FAIL_NUMERIC: 1, FAIL_LINT: 1}
STYLE = {"PASS": "green", "COMPILED": "green", "UNSUPPORTED": "dim"}


def judged(records: list[ResultRecord]) -> list[ResultRecord]:
    """The records that decide a sweep's exit status: our kernels' (backend cutedsl, variants included) and those no
    worker could attribute (a hang or a crash is recorded with no backend) where the sweep ran any kernel of ours,
    else every record (a sweep of peers alone). A peer that misses the rule (torch.compile's router weights 2 ulps
    off at k = 1) is reported in the table, not taken for a failure of ours."""
    ours = [r for r in records if r.backend in ("cutedsl", "")]
    return ours if any(r.backend == "cutedsl" for r in records) else records


def exit_code(records: list[ResultRecord]) -> int:
    present = {r.status for r in judged(records)}
    for status in (TIMEOUT, FAIL_RUNTIME, FAIL_COMPILE, FAIL_NUMERIC, FAIL_LINT):
        if status in present:
            return EXIT_CODES[status]
    return 0


def _x(speedup: float) -> str:
    """A speedup (peer ms / ours ms), green where ours is faster, red where slower."""
    return f"[{'green' if speedup > 1 else 'red' if speedup < 1 else 'default'}]{speedup:.2f}x[/]"


def _speedup(r: Ratio | None) -> str:
    return "" if r is None else _x(r.speedup) + (" [yellow]NOISY[/]" if r.noisy else "")


def _class_cell(s: Stats) -> str:
    noisy = f" [dim]{'+' if s.quiet else ''}{s.noisy} NOISY[/]" if s.noisy else ""
    return (f"{_x(s.geomean)} {s.wins}-{s.losses}" if s.quiet else "") + noisy


def print_speed(sp: Speed | None) -> None:
    """The lead: per peer the geomean speedup (peer ms / ours ms, > 1: ours faster), wins/losses, worst and
    best case; then the same per shape class."""
    if sp is None:
        return
    console.print(f"[bold]speed[/] (speedup = peer ms / ours ms: > 1 ours faster; rows whose timing spread (p10-p90 as a CV) > "
                  f"{NOISY_CV:.0%} are NOISY and left out of the means: {sp.noisy_records} noisy rows left out)",
                  highlight=False)
    for s in sp.per_peer:
        console.print(f"  {_x(s.geomean) if s.quiet else ''} {describe(s)}", highlight=False)
    if sp.per_class:
        table = Table(title="geomean speedup per shape class (peer ms / ours ms; wins-losses, NOISY left out)")
        table.add_column("class")
        for peer in sp.peers:
            table.add_column(f"vs {peer}", justify="right")
        classes = list(dict.fromkeys(s.cls for s in sp.per_class))
        cells = {(s.cls, s.peer): s for s in sp.per_class}
        for cls in classes:
            table.add_row(cls, *[_class_cell(cells[(cls, p)]) for p in sp.peers])
        console.print(table)


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
    vs_ours = {(r.case_id, r.peer): r for r in ratios(records)}
    timed = any(r.timing for r in records)
    table = Table(title=f"{len(records)} results in {run_dir.path}")
    columns = ["case", "shape", "impl", "arch", "status", "max err/bound", "compile"]
    columns += ["median ms", "kernels µs", "GB/s", "% copy", "% same-traffic copy",
                "speedup (its ms / ours)"] if timed else []
    for col in columns:
        table.add_column(col, no_wrap=col in ("case", "status"))
    ordered = sorted(records, key=lambda r: (r.status in GOOD_STATUSES, r.case_id, r.impl))
    for r in ordered[:MAX_ROWS]:
        row = [r.case_id, " ".join(f"{k}={v}" for k, v in r.params.items()), r.impl, r.arch,
               f"[{STYLE.get(r.status, 'red')}]{r.status}[/]", _err(r), _compile(r)]
        if timed:
            t, p = r.timing or {}, r.perf or {}
            row += [f"{t['median_ms']:.4f}" if t else "", _kernels_us(p), f"{p['gbps']:.0f}" if p else "",
                    f"{p['pct_copy']:.1f}" if p else "", _pct_same_traffic(p),
                    _speedup(vs_ours.get((r.case_id, r.impl)))]
        table.add_row(*row)
    if len(ordered) > MAX_ROWS:
        table.caption = f"{len(ordered) - MAX_ROWS} more rows in {run_dir.csv}"
    console.print(table)
    print_speed(speed(records))
    counts = summarize_statuses(records)
    console.print("  ".join(f"[{STYLE.get(s, 'red')}]{s}[/] {n}" for s, n in sorted(counts.items())))
    decide = {id(r) for r in judged(records)}
    peers_bad = [r for r in records if id(r) not in decide and r.status not in GOOD_STATUSES]
    if peers_bad:
        names = ", ".join(sorted({r.impl for r in peers_bad}))
        console.print(f"[yellow]{len(peers_bad)} peer record(s) not good[/] ({names}): listed above; the exit status "
                      "is our kernels'", highlight=False)
    console.print(f"results: {run_dir.results}\n         {run_dir.csv}")
