"""`dsv4bench layouts KERNEL [case options] [--arch]`: compile one case (no GPU) and print the CuTe
layouts its kernel recorded while tracing, by stage, then the lint findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape as rich_escape
from rich.tree import Tree

from dsv4bench.cli.common import check_output, console, fail, resolve_archs, writing
from dsv4bench.compile.cache import compile_recorded, describe
from dsv4bench.compile import ptxas
from dsv4bench.compile.cache import ptxas_fact
from dsv4bench.compile.lints import lint
from kernels.trace import Recording
from dsv4bench.core.case import Case
from dsv4bench.core.registry import Family, Impl, SweepOptions, get_family, impls


def parse_case_options(args: list[str]) -> dict[str, object]:
    """`--width 7168 --sink --no-causal` -> {"width": "7168", "sink": True, "causal": False}."""
    raw: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            fail(f"unexpected argument '{arg}' (case options look like --width 7168)")
        name, _, value = arg[2:].partition("=")
        if value:
            raw[name] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw[name], i = args[i + 1], i + 1
        elif name.startswith("no-"):
            raw[name[3:]] = False
        else:
            raw[name] = True
        i += 1
    return raw


def shaped_like_the_grid(family: Family, filters: dict) -> list[Case]:
    """Production cases with the asked values put in: the layouts of a shape the grid lacks
    (`layouts rmsnorm --width 4416`)."""
    cases = []
    for case in family.cases(SweepOptions(examples=0)):
        params = {**case.params, **{family.options[opt].param: values[0] for opt, values in filters.items()}}
        cases.append(Case(family.name, params, case.seed, "cli"))
    return cases


def pick_case(family: Family, impl: Impl, raw: dict, arch: str) -> Case:
    """The first production case that matches the options (else one shaped like the grid with the
    asked values) and that the impl supports."""
    try:
        filters = family.parse_filters(raw)
    except ValueError as e:
        fail(str(e))
    cases = family.cases(SweepOptions(examples=0, filters=filters)) or shaped_like_the_grid(family, filters)
    for case in cases:
        if not impl.supports(case, arch):
            return case
    fail(f"no {family.name} case matches the given options" if not cases else
         f"{impl.name} supports none of the {len(cases)} matching cases on {arch}")


def render(title: str, rec: Recording, findings: list) -> Tree:
    tree = Tree(title)
    groups: dict[str, Tree] = {}
    for e in rec.entries:
        if e["group"] not in groups:
            groups[e["group"]] = tree.add(f"[bold cyan]{e['group']}[/]")
        node = groups[e["group"]].add(f"[bold]{e['stage']}[/]  [dim]{e['kind']}[/]", highlight=False)
        for name, text in e["fields"].items():
            sep = "\n" if "\n" in str(text) else " "
            node.add(f"[green]{name}[/]:{sep}{rich_escape(str(text))}", highlight=False)
    if not rec.entries:
        tree.add("[yellow]this kernel records no layouts (see docs/layouts.md)[/]")
    lints = tree.add("[bold]lints[/]: " + ("[green]none[/]" if not findings else f"[red]{len(findings)}[/]"))
    for f in findings:
        lints.add(f"[red]{f.rule}[/] {rich_escape(f'[{f.stage}]: {f.message}')}", highlight=False)
    checked = ptxas.summary(ptxas_fact(rec))
    if checked:  # the wgmma-serialized check's outcome, with ptxas's notes (C7519 ...)
        lints.add(f"[dim]ptxas:[/] {rich_escape(checked)}", highlight=False)
    return tree


def layouts_cmd(
    ctx: typer.Context,
    kernel: str = typer.Argument(..., help="kernel family (see `dsv4bench list`)"),
    arch: str = typer.Option("auto", help="auto (this GPU, else sm_90a) | sm_90a | sm_100a"),
    impl_name: str = typer.Option("cutedsl", "--impl", help="which CuTeDSL impl of the family"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the recording and lints as JSON"),
) -> None:
    """Print the traced CuTe layouts of one compile, by stage, and the layout lints. Extra options
    select the case the way `sweep` does (e.g. --width 7168, --hd 512)."""
    if json_out:
        check_output("--json", json_out)
    try:
        family = get_family(kernel)
    except KeyError as e:
        fail(e.args[0])
    archs = resolve_archs(arch)
    if len(archs) != 1 and arch != "auto":
        fail("--arch takes one arch here")
    compiling = [i for i in impls(kernel) if i.compiles]
    impl = next((i for i in compiling if i.name == impl_name), None)
    if impl is None:
        names = ", ".join(i.name for i in compiling) or "none"
        fail(f"{kernel} has no CuTeDSL impl '{impl_name}' (it has: {names})")
    target = archs[0] if archs[0] in impl.archs else impl.archs[0]
    case = pick_case(family, impl, parse_case_options(ctx.args), target)
    console.print(f"compiling {case} for {target} ...", highlight=False)
    try:
        compiled, rec, seconds = compile_recorded(impl, case, target)
    except Exception as e:
        console.print(f"[red]FAIL_COMPILE[/] {type(e).__name__}: {str(e)[:400]}", highlight=False)
        raise typer.Exit(1)
    info = describe(compiled, seconds, "miss")
    findings = lint(rec)
    title = (f"[bold]{kernel}[/] {impl.name} {target}  case {case.id} ({case.shape_str()})  "
             f"compiled in {seconds:.2f} s, {info.registers} registers, {info.local_bytes} B local")
    console.print(render(title, rec, findings))
    for f in findings:
        console.print(f"[yellow]warning:[/] lint {f}", highlight=False)
    if json_out:
        payload = {"case": case.to_json(), "arch": target, "compile": info.to_json(),
                   "recording": rec.to_json(), "lints": [str(f) for f in findings]}
        with writing(f"--json {json_out}"):
            json_out.write_text(json.dumps(payload, indent=1))
        console.print(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    app.command("layouts", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        layouts_cmd)
