"""`dsv4bench report RUN_DIR [--against OTHER_RUN]`: render a run's index.html and results.csv,
or compare it with another run (SAME / FASTER / SLOWER / NOISY per task, new failures, fixes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from dsv4bench.cli.common import console, fail, writing
from dsv4bench.cli.summary import print_speed
from dsv4bench.report.against import FAIL_ON, Comparison, NothingInCommon
from dsv4bench.report.axes import BadAxes
from dsv4bench.report.rundata import NotARunDir

if TYPE_CHECKING:
    from dsv4bench.report.build import Report

MAX_ROWS = 40
STYLE = {"FASTER": "green", "SLOWER": "red", "NOISY": "yellow", "SAME": "dim"}


def print_comparison(cmp: Comparison) -> None:
    table = Table(title=f"against {cmp.base_path}: {len(cmp.rows)} tasks timed in both runs")
    for col in ("case", "shape", "impl", "before ms", "now ms", "change", "verdict"):
        table.add_column(col, no_wrap=col in ("case", "verdict"))
    moved = sorted(cmp.rows, key=lambda r: (r["verdict"] == "SAME", -abs(r["change"])))
    for r in moved[:MAX_ROWS]:
        table.add_row(r["case_id"], r["shape"], r["impl"], f"{r['base_ms']:.4f}", f"{r['new_ms']:.4f}",
                      f"{100 * r['change']:+.1f}%", f"[{STYLE[r['verdict']]}]{r['verdict']}[/]")
    if cmp.rows:
        console.print(table)
    console.print("  ".join(f"[{STYLE[v]}]{v}[/] {n}" for v, n in sorted(cmp.counts.items()))
                  + f"  new failures {len(cmp.new_failures)}  fixes {len(cmp.fixes)}")
    for label, rows, style in (("new failure", cmp.new_failures, "red"), ("fixed", cmp.fixes, "green")):
        for r in rows[:MAX_ROWS]:
            console.print(f"[{style}]{label}[/] {r['case_id']} {r['impl']} {r['arch']}: {r['base_status']} -> "
                          f"{r['new_status']} {r['reason'][:120]}", highlight=False)


def render(run_dir: Path, against: Path | None = None, axes: tuple[str, ...] | None = None,
           new_regressions: int = 0) -> "Report":
    """Write the report and print where it is; bad input exits 2 with one line."""
    from dsv4bench.report.build import write_report  # matplotlib: loaded only by commands that draw

    t0 = time.perf_counter()
    try:
        with writing(f"the report into {run_dir}"):
            report = write_report(run_dir, against, axes, new_regressions)
    except (NotARunDir, BadAxes, NothingInCommon) as e:
        fail(str(e))
    if report.comparison is not None:
        print_comparison(report.comparison)
    console.print(f"report: {report.index}\n        {report.csv}  ({time.perf_counter() - t0:.1f} s)", highlight=False)
    return report


def report_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by `dsv4bench sweep`"),
    against: Optional[Path] = typer.Option(None, help="another run directory to compare with (the baseline)"),
    axes: Optional[str] = typer.Option(None, help="params the error heatmaps span, e.g. hd,s_kv"),
    fail_on: list[str] = typer.Option([], help="with --against, exit 1 when any task is SLOWER beyond the noise "
                                               "rule (slower) or fails anew (new-failures); repeatable"),
) -> None:
    """Render RUN_DIR/index.html (self-contained) and RUN_DIR/results.csv (full precision)."""
    wanted = tuple(a.strip() for a in axes.split(",") if a.strip()) if axes else None
    if axes is not None and not (wanted and len(wanted) <= 2):
        fail(f"--axes takes one or two param names, e.g. hd,s_kv; got '{axes}'")
    bad = [f for f in fail_on if f not in FAIL_ON]
    if bad:
        fail(f"--fail-on takes {' or '.join(FAIL_ON)}; got '{bad[0]}'")
    if fail_on and against is None:
        fail("--fail-on needs --against OLD_RUN")
    report = render(run_dir, against, wanted)
    print_speed(report.speed)
    reasons = report.comparison.failed(tuple(fail_on)) if report.comparison else []
    for reason in reasons:
        console.print(f"[red]--fail-on[/]: {reason}", highlight=False)
    if reasons:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
