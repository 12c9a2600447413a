"""`dsv4bench sweep KERNEL`: plan the case space, run it isolated, record, summarize."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dsv4bench.cli.common import console, fail, gpu_arch, resolve_archs
from dsv4bench.cli.report import render
from dsv4bench.cli.summary import exit_code, print_summary
from dsv4bench.compile.cache import ENV_NO_CACHE
from dsv4bench.core.regressions import record_failures, with_regressions
from dsv4bench.core.registry import SweepOptions, get_family
from dsv4bench.core.results import GOOD_STATUSES, RunDir
from dsv4bench.core.runner import Runner, plan
from dsv4bench.core.environment import describe_environment

FAMILY_OPTIONS = ("hd", "heads", "topk", "sink", "mask", "width", "rows", "dtype")


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
    try:
        return RunDir(path).create()
    except OSError as e:
        fail(f"cannot write to --out {path}: {e.strerror or e}")


def sweep_cmd(
    kernel: str = typer.Argument(..., help="kernel family (see `dsv4bench list`)"),
    hd: Optional[str] = typer.Option(None, help="head dims, e.g. 64,128,256,512 (fmha)"),
    heads: Optional[str] = typer.Option(None, help="query heads, e.g. 64,128 (fmha)"),
    topk: Optional[str] = typer.Option(None, help="top-k sizes (fmha)"),
    sink: Optional[bool] = typer.Option(None, "--sink/--no-sink", help="with or without the attention sink (fmha)"),
    mask: Optional[str] = typer.Option(None, help="masks, e.g. causal,window,topk (fmha)"),
    width: Optional[str] = typer.Option(None, help="normalized widths, e.g. 4096,7168 (rmsnorm)"),
    rows: Optional[str] = typer.Option(None, help="row counts (rmsnorm)"),
    dtype: Optional[str] = typer.Option(None, help="dtypes, e.g. bf16,fp32"),
    examples: int = typer.Option(20, min=0, help="hypothesis-drawn extra cases"),
    seed: int = typer.Option(0, help="seed of the drawn cases and of every input"),
    grid: bool = typer.Option(True, "--grid/--no-grid", help="include the DSV4 production grid"),
    arch: str = typer.Option("auto", help="auto | sm_90a | sm_100a | sm_90a,sm_100a"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile, do not run (no GPU needed)"),
    bench: bool = typer.Option(False, "--bench", help="time every passing impl (GPU)"),
    baseline: Optional[str] = typer.Option(None, help="peers to run beside ours, e.g. torch,quack (default: all)"),
    out: Optional[Path] = typer.Option(None, help="run directory; re-running with the same one resumes"),
    timeout: float = typer.Option(300.0, min=1.0, help="seconds per task before it is killed as TIMEOUT"),
    shard: Optional[str] = typer.Option(None, help="run only shard i of n: i/n"),
    no_cache: bool = typer.Option(False, "--no-cache", help="bypass the compiled-kernel disk cache (cold compiles)"),
) -> None:
    """Sweep a kernel family over its case space against the FP32 oracle."""
    try:
        family = get_family(kernel)
    except KeyError as e:
        fail(e.args[0])
    raw = {k: v for k, v in dict(hd=hd, heads=heads, topk=topk, sink=sink, mask=mask, width=width, rows=rows,
                                 dtype=dtype).items() if v is not None}
    try:
        filters = family.parse_filters(raw)
    except ValueError as e:
        fail(str(e))
    archs = resolve_archs(arch)
    here = gpu_arch()
    gpu = here is not None and not compile_only
    if gpu and archs != [here]:
        fail(f"this GPU is {here}; run {','.join(archs)} with --compile-only")
    if bench and not gpu:
        console.print("[yellow]--bench needs a GPU: timing is skipped on this machine[/]")
    shard_ix = parse_shard(shard)
    baselines = [b.strip() for b in baseline.split(",")] if baseline else None

    run_dir = open_run_dir(out, kernel)
    cases = with_regressions(kernel, family.cases(SweepOptions(examples=examples, seed=seed, grid=grid, filters=filters)))
    if shard_ix:
        cases = cases[shard_ix[0]::shard_ix[1]]
    if not cases:
        fail("no case matches the given options")
    tasks = plan(cases, archs, gpu=gpu, bench=bench and gpu, compile_only=compile_only, baselines=baselines)
    done = run_dir.done_tasks()
    todo = [t for t in tasks if t.key not in done]
    command, environment = "dsv4bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]), describe_environment()
    run_dir.write_meta({
        "command": command,
        "kernel": kernel, "seed": seed, "examples": examples, "archs": archs, "gpu": gpu,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": environment,
        "cases": {c.id: c.to_json() for c in cases},
    })
    replayed = sum(c.origin == "regression" for c in cases)
    console.print(f"[bold]{kernel}[/]: {len(cases)} cases, {len(tasks)} tasks on "
                  f"{'GPU ' + here if gpu else 'CPU (compile-only: ' + ','.join(archs) + ')'}, seed {seed}"
                  + (f"; resuming, {len(tasks) - len(todo)} already done" if len(todo) < len(tasks) else "")
                  + (f"; {replayed} regression case(s) replayed first" if replayed else ""))

    if no_cache:  # read by the workers' CompileCache
        os.environ[ENV_NO_CACHE] = "1"
    runner = Runner(run_dir, timeout_s=timeout, gpu=gpu)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(kernel, total=len(todo))

        def on_record(rec):
            progress.advance(bar)
            if rec.status not in GOOD_STATUSES:
                progress.console.print(f"[red]{rec.status}[/] {rec.case_id} {rec.impl} {rec.arch}: {rec.reason[:160]}")

        try:
            runner.run(todo, on_record)
        except KeyboardInterrupt:
            run_dir.write_csv()
            console.print(f"[yellow]interrupted[/]: finished tasks are in {run_dir.results}; "
                          f"re-run with --out {run_dir.path} to resume")
            raise typer.Exit(130)
    records = run_dir.records()
    print_summary(records, run_dir)
    added = record_failures(kernel, records, environment.get("commit"), command)
    if added:
        console.print(f"[red]{len(added)} failing case(s)[/] added to the regression file (replayed first next time)")
    try:
        render(run_dir.path, new_regressions=len(added))  # also rewrites results.csv
    except Exception as e:  # the records are safe on disk; a report bug must not change the sweep's verdict
        run_dir.write_csv()
        console.print(f"[yellow]report not rendered[/]: {type(e).__name__}: {e}")
    raise typer.Exit(exit_code(records))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_cmd)
