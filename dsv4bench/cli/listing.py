"""`dsv4bench list`: families, impls, archs and what can run here."""

from __future__ import annotations

import typer
from rich.table import Table

from dsv4bench.cli.common import console, gpu_arch
from dsv4bench.core.registry import ARCHS, BROKEN_MODULES, SweepOptions, families, impls


def unsupported_archs(fam, impl) -> list[str]:
    """'arch: UNSUPPORTED (why)' for each arch a CuTeDSL impl is not built for, in its own words
    (its `supports` on the family's first production case)."""
    missing = [a for a in ARCHS if a not in impl.archs]
    if not missing or not impl.compiles or impl.variant:
        return []
    first = fam.cases(SweepOptions(examples=0))[:1]
    return [f"{a}: UNSUPPORTED ({(impl.supports(first[0], a) if first else None) or 'not built for it'})"
            for a in missing]


def list_cmd() -> None:
    """Families, their implementations and archs, and what runs on this machine."""
    here = gpu_arch()
    table = Table(title=f"dsv4bench families (this machine: {here or 'no GPU: compile-only + CPU oracle checks'})")
    for col in ("family", "impl", "backend", "archs", "here"):
        table.add_column(col)
    for name, fam in sorted(families().items()):
        for i, impl in enumerate(impls(name, variants=True)):
            why = impl.available()
            if why:
                status = f"[yellow]{why}[/]"
            elif impl.compiles:
                status = "compile + run" if here else "compile-only"
            else:
                status = "run" if here or not impl.needs_gpu else "needs a GPU"
            if impl.variant:  # declared knock-outs/ablations: run only when `sweep --impl` names them
                status = f"[dim]variant{'' if impl.checked else ' (knock-out, not compared)'}: {status}[/]"
            table.add_row(name if i == 0 else "", impl.name, impl.backend, ",".join(impl.archs), status)
            for line in unsupported_archs(fam, impl):
                table.add_row("", "", "", "", f"[dim]{line}[/]")
        table.add_row(f"[dim]{fam.description}[/]", "", "", "", "", end_section=True)
    console.print(table)
    for module, why in BROKEN_MODULES.items():
        console.print(f"[red]failed to load {module}[/]: {why}")


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
