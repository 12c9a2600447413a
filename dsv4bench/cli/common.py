"""Shared CLI plumbing: the console, bad-input exits and arch resolution."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rich.console import Console

from dsv4bench.core.registry import ARCHS

console = Console()
if not console.is_terminal:  # CI logs and pipes: wide enough that tables stay one line per row
    console = Console(width=160)
EXIT_USAGE = 2
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 0 .. 2**64 - 1 (and negatives, which we refuse)


class UsageProblem(Exception):
    """Bad user input: printed as one line, exit status 2, no traceback."""


def fail(message: str) -> None:
    raise UsageProblem(message)


def check_range(option: str, value: float, lo: float, hi: float = math.inf) -> None:
    """Fail unless lo <= value <= hi; a float must also be finite (NaN fails every comparison)."""
    if not lo <= value <= hi or (isinstance(value, float) and not math.isfinite(value)):
        finite = " and finite" if isinstance(value, float) else ""
        bounds = f"in {lo}..{hi}" if hi != math.inf else f">= {lo}{finite}"
        fail(f"{option} must be {bounds}, got {value}")


def check_output(option: str, path: Path, directory: bool = False) -> None:
    """Fail before any work when `option`'s path cannot be written: a directory where a file is
    wanted (or the reverse), or no writable directory to create it in (a directory's missing
    parents are created; a file's parent must exist)."""
    kind, other = ("a directory", "a file") if directory else ("a file", "a directory")
    if path.exists() and path.is_dir() != directory:
        fail(f"{option} {path} is {other}; it takes {kind} path")
    parent = next((p for p in path.parents if p.exists()), path) if directory else path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        fail(f"cannot write {option} {path}: {parent} is not a writable directory")


@contextmanager
def writing(what: str) -> Iterator[None]:
    """An OSError in the block is one line naming what was being written, exit status 2."""
    try:
        yield
    except OSError as e:
        fail(f"cannot write {what}: {e.strerror or e}")


def gpu_arch() -> str | None:
    """The arch of the visible GPU (sm_90a / sm_100a), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a"


def resolve_archs(arch: str) -> list[str]:
    if arch == "auto":
        here = gpu_arch()
        return [here] if here else list(ARCHS)
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    bad = [a for a in archs if a not in ARCHS]
    if not archs or bad:
        fail(f"unsupported arch '{','.join(bad) or arch}' (supported: auto, {', '.join(ARCHS)})")
    return archs
