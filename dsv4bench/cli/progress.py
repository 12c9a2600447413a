"""A sweep's progress: a rich bar with an ETA on a terminal; elsewhere (CI, pipes, `remote logs -f`)
one plain line per finished task, so a log shows life every task instead of nothing for minutes."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from dsv4bench.core.results import GOOD_STATUSES, ResultRecord

REASON_CHARS = 160


def _failure(rec: ResultRecord) -> str:
    return f": {escape(rec.reason[:REASON_CHARS])}" if rec.status not in GOOD_STATUSES and rec.reason else ""


def _status(rec: ResultRecord) -> str:
    return rec.status if rec.status in GOOD_STATUSES else f"[red]{rec.status}[/]"


@contextmanager
def task_progress(console: Console, title: str, total: int) -> Iterator[Callable[[ResultRecord], None]]:
    """Yields the callback to call with each finished task's record."""
    if not console.is_terminal:
        started, done = time.monotonic(), 0

        def line(rec: ResultRecord) -> None:
            nonlocal started, done
            now, done = time.monotonic(), done + 1
            console.print(f"[{done}/{total}] {_status(rec)} {rec.case_id} {rec.impl} {rec.arch} {rec.mode} "
                          f"{now - started:.1f}s{_failure(rec)}", highlight=False, soft_wrap=True)
            started = now

        yield line
        return
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(title, total=total)

        def advance(rec: ResultRecord) -> None:
            progress.advance(bar)
            if rec.status not in GOOD_STATUSES:
                progress.console.print(f"{_status(rec)} {rec.case_id} {rec.impl} {rec.arch}{_failure(rec)}")

        yield advance
