"""Shared CLI plumbing: the console, bad-input exits and arch resolution."""

from __future__ import annotations

from rich.console import Console

from dsv4bench.core.registry import ARCHS

console = Console()
if not console.is_terminal:  # CI logs and pipes: wide enough that tables stay one line per row
    console = Console(width=160)
EXIT_USAGE = 2


class UsageProblem(Exception):
    """Bad user input: printed as one line, exit status 2, no traceback."""


def fail(message: str) -> None:
    raise UsageProblem(message)


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
