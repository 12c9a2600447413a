"""`dsv4bench list`: families, impls, archs and what can run here."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from dsv4bench.cli.common import console, gpu_arch
from dsv4bench.cli.jsonout import JSON_OPTION, print_json
from dsv4bench.core.registry import ARCHS, BROKEN_MODULES, SweepOptions, families, impls


def unsupported_archs(fam, impl) -> dict[str, str]:
    """arch -> why, for each arch a CuTeDSL impl is not built for, in its own words (its `supports`
    on the family's first production case)."""
    missing = [a for a in ARCHS if a not in impl.archs]
    if not missing or not impl.compiles or impl.variant:
        return {}
    first = fam.cases(SweepOptions(examples=0))[:1]
    return {a: (impl.supports(first[0], a) if first else None) or "not built for it" for a in missing}


def status_here(impl, here: str | None) -> str:
    """What the impl does on this machine: run / compile + run / compile-only / needs a GPU, or why
    it is unavailable."""
    why = impl.available()
    if why:
        return why
    if impl.compiles:
        return "compile + run" if here else "compile-only"
    return "run" if here or not impl.needs_gpu else "needs a GPU"


def listing(here: str | None) -> dict:
    """Everything `list` shows, as plain data (the --json document)."""
    fams = []
    for name, fam in sorted(families().items()):
        rows = [{"name": im.name, "backend": im.backend, "archs": list(im.archs), "here": status_here(im, here),
                 "available": not im.available(), "variant": bool(im.variant), "checked": bool(im.checked),
                 "unsupported_archs": unsupported_archs(fam, im)} for im in impls(name, variants=True)]
        fams.append({"name": name, "description": fam.description, "impls": rows})
    return {"gpu_arch": here, "families": fams, "broken_modules": dict(BROKEN_MODULES)}


def list_cmd(as_json: bool = JSON_OPTION) -> None:
    """Families, their implementations and archs, and what runs on this machine."""
    here = gpu_arch()
    data = listing(here)
    if as_json:
        print_json(data)
        return
    table = Table(title=f"dsv4bench families (this machine: {here or 'no GPU: compile-only + CPU oracle checks'})")
    for col in ("family", "impl", "backend", "archs", "here"):
        table.add_column(col)
    for fam in data["families"]:
        for i, im in enumerate(fam["impls"]):
            status = escape(im["here"]) if im["available"] else f"[yellow]{escape(im['here'])}[/]"
            if im["variant"]:  # declared knock-outs/ablations: run only when `sweep --impl` names them
                status = f"[dim]variant{'' if im['checked'] else ' (knock-out, not compared)'}: {status}[/]"
            table.add_row(fam["name"] if i == 0 else "", im["name"], im["backend"], ",".join(im["archs"]), status)
            for arch, why in im["unsupported_archs"].items():
                table.add_row("", "", "", "", f"[dim]{arch}: UNSUPPORTED ({escape(why)})[/]")
        table.add_row(f"[dim]{escape(fam['description'])}[/]", "", "", "", "", end_section=True)
    console.print(table)
    for module, why in data["broken_modules"].items():
        console.print(f"[red]failed to load {module}[/]: {why}")


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
