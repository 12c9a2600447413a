"""Resuming into a run directory: only the sweep that made it, unless merging is asked for.

A sweep records the options that decide its tasks (`options` in run.json). Re-running with the
same `--out` resumes only when those options are the same: another filter, seed or impl set would
mix two case spaces in one results table under one command. `--force-merge` adds the new sweep's
tasks anyway; run.json then keeps the first sweep's command and options, and every invocation's
own command and start stay in its `invocations` entry (`invoked`, `invoked_at`).
"""

from __future__ import annotations

import json
from typing import Any


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def option_differences(recorded: dict, options: dict) -> list[str]:
    """'name: recorded -> now' for each option that differs."""
    names = sorted(set(recorded) | set(options))
    return [f"{n}: {_show(recorded.get(n))} -> {_show(options.get(n))}" for n in names
            if _show(recorded.get(n)) != _show(options.get(n))]


def resume_conflict(meta: dict, command: str, options: dict) -> str | None:
    """Why this sweep may not resume into a run directory whose run.json is `meta`; None when it
    may (a fresh directory, or the same options)."""
    if "command" not in meta:
        return None
    if "options" not in meta:  # made before options were recorded: only the same command resumes
        return None if meta["command"] == command else f"it was made by `{meta['command']}`"
    diff = option_differences(meta["options"], options)
    return f"it was made with other options ({'; '.join(diff)})" if diff else None


def invocation_meta(meta: dict, command: str, options: dict, started: str, cases: dict) -> dict:
    """What this invocation writes into run.json (RunDir.write_meta merges it): the first sweep's
    command, options and start stay; the cases are the union of every invocation's."""
    first = {"command": command, "options": options, "started": started}
    return {
        **{k: meta.get(k, v) for k, v in first.items()}, "invoked": command, "invoked_at": started,
        "cases": {**meta.get("cases", {}), **cases},
    }
