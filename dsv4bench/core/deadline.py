"""A per-case deadline for the one-process benchmark scripts (benchmarks/moe_stages.py, moe_phases.py).

A hung kernel blocks the main thread inside a CUDA call, where no Python signal handler runs, so an alarm cannot end
it. faulthandler's watchdog is a C thread: past the deadline it prints every Python thread's stack to stderr and
ends the process (exit status 1), whatever the main thread is blocked in. The scripts append each case's record
as it ends, so the cases before the hung one are kept; the sweep's workers have their own timeout
(dsv4bench/core/runner.py, `sweep --timeout`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys


@contextlib.contextmanager
def case_deadline(seconds: float | None, label: str):
    """End the process if the block runs past `seconds` (None or 0: no deadline); `label` names the case on stderr
    first, so the stack dump that a hang leaves says which case it was."""
    if not seconds:
        yield
        return
    if seconds < 0:
        raise ValueError(f"a deadline is a positive number of seconds, got {seconds}")
    print(f"[deadline {seconds:g} s] {label}", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
