"""`dsv4bench sweep FAMILY`: plan the case space, run it isolated, record, summarize.

`sweep` is a group with one command per discovered family, built when it is called from the
family's declaration: the common options below plus the family's own shape options
(`Family.options`), so `dsv4bench sweep <family> --help` shows exactly what that family takes.
"""

from __future__ import annotations

import inspect
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer
import typer.core

from dsv4bench.cli.common import console, fail, gpu_arch, resolve_archs, writing
from dsv4bench.cli.progress import task_progress
from dsv4bench.cli.report import render
from dsv4bench.cli.summary import exit_code, print_summary
from dsv4bench.compile.cache import ENV_NO_CACHE, CompileCache
from dsv4bench.core.environment import describe_environment
from dsv4bench.core.filters import cases_under_filters
from dsv4bench.core.regressions import RUN_FILE, record_failures, with_regressions
from dsv4bench.core.registry import Family, SweepOptions, broken_note, family_packages, impls, load_family
from dsv4bench.core.results import RunDir
from dsv4bench.core.resume import invocation_meta, resume_conflict
from dsv4bench.core.runner import DEFAULT_TIMEOUT_S, TIMINGS, Runner, plan


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    try:
        i, n = (int(p) for p in shard.split("/"))
    except ValueError:
        fail(f"--shard takes i/n (e.g. 0/4), got '{shard}'")
    if not (n >= 1 and 0 <= i < n):
        fail(f"--shard i/n needs 0 <= i < n, got '{shard}'")
    return i, n


def open_run_dir(out: Optional[Path], kernel: str) -> RunDir:
    path = out or Path("reports") / f"{kernel}-{time.strftime('%Y%m%d-%H%M%S')}"
    with writing(f"to --out {path}"):
        return RunDir(path).create()


def parse_impls(family: Family, impl: str | None) -> list[str] | None:
    """--impl a,b: the impls to run (declared variants only run when named here)."""
    if impl is None:
        return None
    names = [n.strip() for n in impl.split(",") if n.strip()]
    known = [i.name for i in impls(family.name, variants=True)]
    bad = [n for n in names if n not in known]
    if not names or bad:
        fail(f"--impl: {family.name} has no impl '{(bad or [impl])[0]}' (impls: {', '.join(known)})"
             f"{broken_note(family.name)}")
    return names


def parse_baselines(family: Family, baseline: str | None) -> list[str] | None:
    """--baseline a,b: the peers to run beside ours (the family's impls that do not compile)."""
    if baseline is None:
        return None
    names = [n.strip() for n in baseline.split(",") if n.strip()]
    known = [i.name for i in impls(family.name, variants=True) if not i.compiles]
    bad = [n for n in names if n not in known]
    if not names or bad:
        fail(f"--baseline: {family.name} has no baseline '{(bad or [baseline])[0]}' "
             f"(baselines: {', '.join(known) or 'none'})")
    return names


def draw_cases(family: Family, opts: SweepOptions) -> list:
    """The grid and `opts.examples` draws that satisfy the filters; one line when fewer exist."""
    cases, draws = cases_under_filters(family, opts)
    found = sum(c.origin == "hypothesis" for c in cases)
    if opts.filters and found < opts.examples:
        console.print(f"[yellow]--examples {opts.examples}[/]: only {found} drawn case(s) satisfy the filters "
                      f"({draws} draws made, seed {opts.seed})", highlight=False, soft_wrap=True)
    return cases


def grid_misses(family: Family, filters: dict) -> list[str]:
    """Why filters select nothing from the grid: for each option that only selects (no `extends`) and asks
    only for values no grid case has, '--opt v: the grid has a, b, ...'."""
    grid = family.cases(SweepOptions(examples=0, grid=True))
    out = []
    for opt, values in filters.items():
        o = family.options[opt]
        if o.extends:  # its asked values were added to the grid: not why nothing matched
            continue
        have = {c.get(o.param, o.default) for c in grid}
        if not set(values) & have:
            name = {v: k for k, v in o.aliases.items()}  # a case value as the CLI spells it ("gemm" for none)
            numbers_first = sorted(have, key=lambda v: (0, v, "") if isinstance(v, int) else (1, 0, str(v)))
            out.append(f"--{opt} {','.join(str(name.get(v, v)) for v in values)}: the grid has "
                       + ", ".join(str(name.get(v, v)) for v in numbers_first))
    return out


def sweep_family(
    family: Family,
    shape: dict,
    examples: int = typer.Option(20, min=0, help="hypothesis-drawn extra cases"),
    seed: int = typer.Option(0, help="seed of the drawn cases and of every input"),
    grid: bool = typer.Option(True, "--grid/--no-grid", help="include the DSV4 production grid"),
    arch: str = typer.Option("auto", help="auto | sm_90a | sm_100a | sm_90a,sm_100a"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile only: run and check nothing (no GPU "
                                                                     "needed; --cpu-check adds the CPU checks)"),
    cpu_check: Optional[bool] = typer.Option(
        None, "--cpu-check/--no-cpu-check", show_default=False,
        help="check each case's low-precision torch reference against the FP32 oracle on the CPU (slow for large "
             "cases); default: on without a GPU, off with --compile-only or on a GPU"),
    bench: bool = typer.Option(False, "--bench", help="time every passing impl (GPU)"),
    timing: str = typer.Option("events", help="how --bench times a call: events (CUDA events around each call) | "
                                              "graph (the call captured once in a CUDA graph, its replays timed: no "
                                              "host work between a call's kernels, as serving stacks run decode)"),
    kernel_split: bool = typer.Option(True, "--kernel-split/--no-kernel-split",
                                      help="with --bench: each timed call's device time per kernel (CUPTI: two "
                                           "profiled passes a record); off for quicker tuning probes"),
    impl: Optional[str] = typer.Option(None, help="only these impls, e.g. cutedsl,cutedsl:no-softmax "
                                                 "(declared variants run only when named; see `list`)"),
    baseline: Optional[str] = typer.Option(None, help="peers to run beside ours, e.g. torch,quack (default: all)"),
    out: Optional[Path] = typer.Option(None, help="run directory; re-running with the same one resumes"),
    force_merge: bool = typer.Option(False, "--force-merge", help="resume into an --out made with other options "
                                                                  "(refused otherwise)"),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, min=1.0, help="seconds per task before it is killed as TIMEOUT"),
    shard: Optional[str] = typer.Option(None, help="run only shard i of n: i/n"),
    no_cache: bool = typer.Option(False, "--no-cache", help="bypass the compiled-kernel disk cache (cold compiles)"),
) -> None:
    """Sweep a kernel family over its case space against the FP32 oracle."""
    kernel = family.name
    raw = {k: v for k, v in shape.items() if v is not None}
    try:
        filters = family.parse_filters(raw)
    except ValueError as e:
        fail(str(e))
    if timing not in TIMINGS:
        fail(f"--timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    if timing != "events" and not bench:
        fail("--timing sets how --bench times a call: add --bench")
    if not kernel_split and not bench:
        fail("--no-kernel-split drops a part of --bench's record: add --bench")
    chosen = parse_impls(family, impl)
    archs = resolve_archs(arch)
    here = gpu_arch()
    gpu = here is not None and not compile_only
    if gpu and archs != [here]:
        fail(f"this GPU is {here}; run {','.join(archs)} with --compile-only")
    if bench and not gpu:
        console.print("[yellow]--bench needs a GPU: timing is skipped on this machine[/]")
    shard_ix = parse_shard(shard)
    baselines = parse_baselines(family, baseline)
    checks = cpu_check if cpu_check is not None else not (gpu or compile_only)
    options = {"kernel": kernel, "filters": filters, "examples": examples, "seed": seed, "grid": grid,
               "archs": archs, "gpu": gpu, "compile_only": compile_only, "cpu_check": checks,
               "bench": bench and gpu, "impl": chosen, "baseline": baselines, "shard": shard_ix,
               **({"timing": timing} if timing != "events" else {}),
               **({} if kernel_split else {"kernel_split": False})}
    command = "dsv4bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    run_dir = open_run_dir(out, kernel)
    conflict = resume_conflict(run_dir.read_meta(), command, options)
    if conflict and not force_merge:
        fail(f"--out {run_dir.path} is another sweep's: {conflict}; use the same options to resume it, "
             f"another --out, or --force-merge to add this sweep's tasks to it")
    cases = with_regressions(kernel, draw_cases(family, SweepOptions(examples=examples, seed=seed, grid=grid,
                                                                     filters=filters)))
    if shard_ix:
        cases = cases[shard_ix[0]::shard_ix[1]]
    if not cases:
        misses = grid_misses(family, filters) if grid else []
        fail("no case matches the given options" + "".join(f"; {m}" for m in misses)
             + ("; these options select from the grid and the drawn cases (--examples), they add none" if misses else ""))
    tasks = plan(cases, archs, gpu=gpu, bench=bench and gpu, compile_only=compile_only, baselines=baselines,
                 only=chosen, cpu_check=checks, timing=timing, kernel_split=kernel_split)
    done = run_dir.done_tasks()
    todo = [t for t in tasks if t.key not in done]
    environment = describe_environment()
    if conflict:
        console.print(f"[yellow]--force-merge[/]: adding to {run_dir.path}, whose run.json keeps its first "
                      f"command; {conflict}", highlight=False, soft_wrap=True)
    run_dir.write_meta({
        **invocation_meta(run_dir.read_meta(), command, options, time.strftime("%Y-%m-%d %H:%M:%S"),
                          {c.id: c.to_json() for c in cases}),
        "kernel": kernel, "seed": seed, "examples": examples, "archs": archs, "gpu": gpu,
        "environment": environment,
    })
    replayed = sum(c.origin == "regression" for c in cases)
    console.print(f"[bold]{kernel}[/]: {len(cases)} cases, {len(tasks)} tasks on "
                  f"{'GPU ' + here if gpu else 'CPU (compile' + (' + CPU check' if checks else ' only')}"
                  f"{'' if gpu else ': ' + ','.join(archs) + ')'}, seed {seed}"
                  + (f"; resuming, {len(tasks) - len(todo)} already done" if len(todo) < len(tasks) else "")
                  + (f"; {replayed} regression case(s) replayed first" if replayed else ""))

    if no_cache:  # read by the workers' CompileCache
        os.environ[ENV_NO_CACHE] = "1"
    else:  # an unusable cache is said once here: the workers' own warnings go to their logs
        CompileCache().disk_ready()
    runner = Runner(run_dir, timeout_s=timeout, gpu=gpu)
    with task_progress(console, kernel, len(todo)) as on_record:
        try:
            runner.run(todo, on_record)
        except KeyboardInterrupt:
            run_dir.write_csv()
            console.print(f"[yellow]interrupted[/]: finished tasks are in {run_dir.results}; "
                          f"re-run with --out {run_dir.path} to resume")
            raise typer.Exit(130)
    records = run_dir.records()
    print_summary(records, run_dir)
    added = record_failures(kernel, records, environment.get("commit"), command, run_dir.path / RUN_FILE, timeout)
    if added:
        console.print(f"[red]{len(added)} failing case(s)[/] new to the regression file, recorded in "
                      f"{run_dir.path / RUN_FILE}; `dsv4bench regressions add {run_dir.path}` promotes them",
                      highlight=False, soft_wrap=True)
    try:
        render(run_dir.path, new_regressions=len(added))  # also rewrites results.csv
    except Exception as e:  # the records are safe on disk; a report bug must not change the sweep's verdict
        run_dir.write_csv()
        console.print(f"[yellow]report not rendered[/]: {type(e).__name__}: {e}")
    raise typer.Exit(exit_code(records))


COMMON = [p for p in inspect.signature(sweep_family, eval_str=True).parameters.values()
          if p.name not in ("family", "shape")]


try:  # typer >= 0.22 carries its own click, whose exceptions are the ones raised
    from typer._click.exceptions import NoSuchOption
except ImportError:
    from click.exceptions import NoSuchOption


class FamilyCommand(typer.core.TyperCommand):
    """A family's sweep command: an option it does not take is one line naming those it does."""

    family: Family

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as e:
            takes = ", ".join(f"--{o}" for o in self.family.options) or "no shape options"
            fail(f"option {e.option_name} does not apply to {self.family.name} (its shape options: {takes}; "
                 f"`dsv4bench sweep {self.family.name} --help` lists every option)")


def family_command(family: Family):
    """`sweep <family>`: the common options plus the family's declared shape options."""
    clash = sorted(set(family.options) & {p.name for p in COMMON})
    if clash:
        fail(f"family {family.name} declares option --{clash[0]}, which every sweep already has")
    own = [inspect.Parameter(
        name.replace("-", "_"), inspect.Parameter.KEYWORD_ONLY, annotation=Optional[bool] if opt.flag else Optional[str],
        default=typer.Option(None, f"--{name}/--no-{name}" if opt.flag else f"--{name}", help=opt.describe(),
                             show_default=False))
        for name, opt in family.options.items()]

    def command(**kwargs):
        shape = {name: kwargs.pop(name.replace("-", "_")) for name in family.options}
        sweep_family(family, shape, **kwargs)

    command.__signature__ = inspect.Signature(own + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in COMMON])
    app = typer.Typer(add_completion=False)
    app.command(family.name, cls=FamilyCommand, help=f"{family.description}.\n\nSweeps {family.name} over its "
                                                     f"case space against the FP32 oracle.")(command)
    cmd = typer.main.get_command(app)
    cmd.family = family
    return cmd


class FamilyGroup(typer.core.TyperGroup):
    """One subcommand per family, discovered from kernels/ and built only when called."""

    def list_commands(self, ctx) -> list[str]:
        return sorted(family_packages())

    def get_command(self, ctx, name: str):
        try:
            family = load_family(name)
        except KeyError as e:
            fail(e.args[0])
        return family_command(family)


def register(app: typer.Typer) -> None:
    group = typer.Typer(cls=FamilyGroup, no_args_is_help=True, add_completion=False,
                        help="Sweep a kernel family against its FP32 oracle (`sweep FAMILY --help`: its options).")
    app.add_typer(group, name="sweep")
