"""`dsv4bench remote hosts|submit|status|logs|fetch|cancel`: run dsv4bench on a GPU host over SSH or Slurm.

Hosts live in ~/.config/dsv4bench/hosts.toml (or --hosts FILE, or $DSV4BENCH_HOSTS); see docs/remote.md.
Exit statuses: 0 pass, 1 numeric failure, 2 bad input, 3 runtime failure, 4 timeout, 5 infrastructure
(host unreachable, transfer failed, wrapper lost), 6 compile failure, 130 cancelled.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from dsv4bench.cli.common import console, fail
from dsv4bench.core.results import RunDir
from dsv4bench.remote import jobs, logs, outcome, registry
from dsv4bench.remote.config import ConfigError, get_host, load_hosts
from dsv4bench.remote.merge import find_run_dirs, merge_run_dirs
from dsv4bench.remote.packing import PackError, pack_tree
from dsv4bench.remote.probe import probe
from dsv4bench.remote.ssh import InfraError, Remote

app = typer.Typer(no_args_is_help=True, help="Run dsv4bench on a remote GPU host (ssh) or a Slurm cluster.")
HOSTS_OPT = typer.Option(None, "--hosts", help="hosts file (default ~/.config/dsv4bench/hosts.toml)")
STYLE = {outcome.PASS: "green", outcome.RUNNING: "cyan", outcome.QUEUED: "dim"}
MERGED = "merged"


def _run(coro):
    """Run a coroutine; bad input exits 2, infrastructure failures 5, each with one line."""
    try:
        return asyncio.run(coro)
    except (ConfigError, registry.UnknownJob, PackError) as e:
        fail(str(e))
    except InfraError as e:
        console.print(f"[bold red]infrastructure:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(outcome.EXIT_CODES[outcome.INFRA])


def _styled(name: str) -> str:
    return f"[{STYLE.get(name, 'red')}]{name}[/]"


@app.command("hosts")
def hosts_cmd(hosts: Optional[Path] = HOSTS_OPT) -> None:
    """List the configured hosts and check each: reachable, GPU, driver, CUDA, cutlass-dsl."""
    try:
        configured = load_hosts(hosts)
    except ConfigError as e:
        fail(str(e))

    async def check_all():
        return await asyncio.gather(*(probe(h) for h in configured.values()))

    table = Table(title=f"{len(configured)} hosts")
    for col in ("host", "backend", "ssh", "workdir", "reachable", "GPU", "driver", "CUDA", "cutlass-dsl", "python"):
        table.add_column(col)
    errors = []
    for h, facts in zip(configured.values(), _run(check_all())):
        ok = "error" not in facts
        errors += [] if ok else [facts["error"]]
        row = [escape(v) for v in (h.name, h.backend, h.ssh, h.workdir)] + ["[green]yes[/]" if ok else "[red]no[/]"]
        row += [escape(facts.get(k) or "") or ("[dim]none[/]" if ok else "")
                for k in ("gpu", "driver", "cuda", "cutlass_dsl", "python")]
        table.add_row(*row)
    console.print(table)
    for error in errors:
        console.print(f"[red]unreachable:[/] {escape(error)}", highlight=False)
    raise typer.Exit(outcome.EXIT_CODES[outcome.INFRA] if errors else 0)


@app.command("submit")
def submit_cmd(
    host: str = typer.Argument(..., help="host name from the hosts file"),
    args: list[str] = typer.Argument(None, help="dsv4bench arguments, after --"),
    follow: bool = typer.Option(False, "--follow", "-f", help="stream the log until the job ends"),
    shards: int = typer.Option(1, min=1, help="Slurm hosts: run `sweep` as an array of N `--shard i/N` tasks"),
    tree: Path = typer.Option(Path("."), help="git checkout to pack (its tracked files and uncommitted edits)"),
    hosts: Optional[Path] = HOSTS_OPT,
) -> None:
    """Pack the tree, upload it (unless the host has it), launch `dsv4bench ARGS` detached; print the job id."""
    argv = list(args or [])
    if not argv:
        fail("nothing to run: give dsv4bench arguments after --, e.g. `remote submit b200 -- sweep rmsnorm`")
    try:
        cfg = get_host(host, hosts)
    except ConfigError as e:
        fail(str(e))
    if shards > 1 and (cfg.backend != "slurm" or argv[0] != "sweep" or "--shard" in argv):
        fail("--shards N needs a slurm host and a `sweep` without --shard")
    try:
        pack = pack_tree(tree)
    except PackError as e:
        fail(str(e))
    record, sent = _run(jobs.submit(cfg, pack, argv, tasks=shards if cfg.backend == "slurm" else 1))
    tree_note = f"tree {pack.tree_id[:12]} " + ("sent" if sent else "already on the host")
    slurm_note = f", slurm job {record.slurm_id} ({record.tasks} tasks)" if record.slurm_id else ""
    console.print(f"submitted [bold]{record.id}[/] to {escape(cfg.name)}{slurm_note}; {tree_note}", highlight=False)
    print(record.id, flush=True)
    if follow:
        _follow(record, task=None)


def _follow(record: registry.JobRecord, task: Optional[int]) -> None:
    sys.stdout.flush()
    try:
        status = _run(logs.stream(record, sys.stdout.buffer, follow=True, task=task))
    except KeyboardInterrupt:
        console.print(f"[yellow]stopped following[/]; job {record.id} goes on "
                      f"(`dsv4bench remote logs {record.id} --follow` resumes, `remote cancel` stops it)")
        raise typer.Exit(130)
    _print_status(record, status)
    raise typer.Exit(status.exit_code)


def _print_status(record: registry.JobRecord, status: jobs.JobStatus) -> None:
    detail = ""
    if len(status.tasks) > 1:
        detail = " (" + ", ".join(f"{name} {o}" for name, o in sorted(status.tasks.items())) + ")"
    console.print(f"job {record.id} on {escape(record.host.name)}: {_styled(status.outcome)}{detail}", highlight=False)


@app.command("status")
def status_cmd(job: Optional[str] = typer.Argument(None, help="job id (or a unique prefix/suffix); all jobs without")) -> None:
    """The state of one job (exit status: its outcome once finished) or of every job submitted from here."""
    if job:
        record = _load(job)

        async def one():
            async with Remote(record.host) as remote:
                return await jobs.status(remote, record)

        status = _run(one())
        _print_status(record, status)
        raise typer.Exit(status.exit_code if outcome.finished(status.outcome) else 0)
    records = _registry(registry.all_jobs)

    async def every():
        by_host: dict[str, list[registry.JobRecord]] = {}
        for r in records:
            by_host.setdefault(r.host.name, []).append(r)
        results: dict[str, str] = {}

        async def host_jobs(group):
            try:
                async with Remote(group[0].host) as remote:
                    for r in group:
                        results[r.id] = (await jobs.status(remote, r)).outcome
            except InfraError:
                results.update({r.id: "unreachable" for r in group if r.id not in results})

        await asyncio.gather(*(host_jobs(g) for g in by_host.values()))
        return results

    results = _run(every())
    table = Table(title=f"{len(records)} jobs")
    for col in ("job", "host", "status", "command"):
        table.add_column(col, no_wrap=col != "command")
    for r in records:
        table.add_row(r.id, escape(r.host.name), _styled(results[r.id]), escape(shlex.join(r.argv)))
    console.print(table)


@app.command("logs")
def logs_cmd(
    job: str = typer.Argument(..., help="job id"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep streaming until the job ends (resumes after a dropped connection)"),
    task: Optional[int] = typer.Option(None, help="Slurm array task (default 0)"),
) -> None:
    """Print a job's output (stdout and stderr, in order)."""
    record = _load(job)
    if task is not None and not 0 <= task < record.tasks:
        fail(f"job {record.id} has tasks 0..{record.tasks - 1}")
    if follow:
        _follow(record, task)
    _run(logs.stream(record, sys.stdout.buffer, follow=False, task=task))


@app.command("fetch")
def fetch_cmd(
    job: str = typer.Argument(..., help="job id"),
    dest: Optional[Path] = typer.Option(None, help="where to put it (default reports/JOB_ID)"),
) -> None:
    """Copy the job directory (logs, run directories) here, merge shards, render the reports."""
    record = _load(job)
    dest = dest or Path("reports") / record.id

    async def get():
        async with Remote(record.host) as remote:
            return await jobs.fetch(remote, record, dest)

    files = _run(get())
    runs = [p for p in find_run_dirs(dest) if p.name != MERGED or p.parent != dest]
    if record.tasks > 1 and runs:
        runs = [merge_run_dirs(runs, dest / MERGED).path]
    table = Table(title=f"job {record.id}: {len(files)} files in {dest}")
    table.add_column("run directory")
    table.add_column("records")
    table.add_column("report")
    for run in runs:
        table.add_row(escape(str(run)), str(len(RunDir(run).records())), render(run))
    console.print(table)


def render(run: Path) -> str:
    """Write the run's HTML report (and CSV); the report's path, or why there is none."""
    from dsv4bench.report.build import write_report  # matplotlib and jinja2: only when fetching
    from dsv4bench.report.rundata import NotARunDir

    try:
        return escape(str(write_report(run).index))
    except (NotARunDir, ValueError) as e:
        return f"[yellow]no report: {escape(str(e))}[/]"


@app.command("cancel")
def cancel_cmd(job: str = typer.Argument(..., help="job id")) -> None:
    """TERM the job's process group and session, KILL them after the grace period; report other GPU
    processes. A finished job is left as it ended."""
    record = _load(job)

    async def stop():
        async with Remote(record.host) as remote:
            lines = await jobs.cancel(remote, record)
            return lines, await jobs.status(remote, record)

    lines, status = _run(stop())
    for line in lines:
        console.print(escape(line), highlight=False)
    _print_status(record, status)


def _load(job: str) -> registry.JobRecord:
    return _registry(registry.load, job)


def _registry(read, *args):
    """A read of the local job registry; an unknown job or a corrupt job file is bad input."""
    try:
        return read(*args)
    except registry.UnknownJob as e:
        fail(str(e))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="remote")
