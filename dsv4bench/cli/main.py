"""The dsv4bench command line: one root app, one module per command group."""

from __future__ import annotations

import sys

import typer

from dsv4bench.cli import env as env_cmd
from dsv4bench.cli import cache as cache_cmd
from dsv4bench.cli import layouts, listing, remote, repro, sweep
from dsv4bench.cli import report as report_cmd
from dsv4bench.cli.common import EXIT_USAGE, UsageProblem, console

app = typer.Typer(
    name="dsv4bench", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Correctness-and-tuning workbench for the CuTeDSL kernels of DeepSeek-V4.",
)
for module in (listing, sweep, repro, layouts, cache_cmd, env_cmd, report_cmd, remote):
    module.register(app)


def main() -> None:
    try:
        app()
    except UsageProblem as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)
