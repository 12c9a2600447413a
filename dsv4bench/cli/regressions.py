"""`dsv4bench regressions add RUN`: promote the failures a sweep recorded in its run directory to
the family's checked-in regression file (replayed first by every later sweep).

A sweep never writes the checked-in file itself; promoting is this explicit step, so a failure
from a broken machine, a local edit or a short --timeout is not made permanent by accident.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dsv4bench.cli.common import console, fail, writing
from dsv4bench.core.regressions import RUN_FILE, promote, read_entries, regression_file
from dsv4bench.core.results import GOOD_STATUSES, STATUSES, RunDir
from dsv4bench.core.runner import DEFAULT_TIMEOUT_S

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="The checked-in regression files (sweeps/regressions/<family>.jsonl).")
FAILING = [s for s in STATUSES if s not in GOOD_STATUSES]


def parse_statuses(raw: list[str] | None) -> set[str] | None:
    names = {s.strip().upper() for item in raw or [] for s in item.split(",") if s.strip()}
    bad = sorted(names - set(FAILING))
    if bad:
        fail(f"--status: no failing status '{bad[0]}' (failing statuses: {', '.join(FAILING)})")
    return names or None


def run_entries(run: Path) -> tuple[str, list[dict]]:
    """The family and the recorded failures of run directory `run`."""
    path = run / RUN_FILE
    if not run.is_dir():
        fail(f"{run} is not a run directory")
    entries = read_entries(path)
    family = RunDir(run).read_meta().get("kernel") or next((e["family"] for e in entries if "family" in e), None)
    if family is None:
        fail(f"{run} is not a sweep's run directory (no run.json naming its family)")
    return family, entries


@app.command("add")
def add(
    run: Path = typer.Argument(..., help="a sweep's run directory (its --out)"),
    status: Optional[List[str]] = typer.Option(None, "--status", help=f"promote only these statuses (repeat or "
                                                                       f"comma-separate: {', '.join(FAILING)})"),
    short_timeouts: bool = typer.Option(False, "--short-timeouts", help=f"also promote TIMEOUTs of a sweep whose "
                                        f"--timeout was below the default {DEFAULT_TIMEOUT_S:g} s (skipped otherwise)"),
) -> None:
    """Promote the failures a sweep recorded in RUN/regressions.jsonl to the checked-in regression file."""
    statuses = parse_statuses(status)
    family, entries = run_entries(run)
    with writing(f"to {regression_file(family)}"):
        result = promote(family, entries, statuses, short_timeouts, DEFAULT_TIMEOUT_S)
    console.print(f"{len(result.added)} case(s) added to {regression_file(family)}"
                  + (f"; {result.known} already there" if result.known else "")
                  + (f"; {result.other_status} of other statuses left out" if result.other_status else ""),
                  highlight=False, soft_wrap=True)
    if result.short_timeouts:
        limits = ", ".join(f"{t:g}" for t in sorted(set(result.short_timeouts)))
        console.print(f"[yellow]skipped {len(result.short_timeouts)} TIMEOUT case(s)[/] of a --timeout of {limits} s "
                      f"(below the default {DEFAULT_TIMEOUT_S:g} s: the limit may be what failed); "
                      f"--short-timeouts promotes them", highlight=False, soft_wrap=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="regressions")
