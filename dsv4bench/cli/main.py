"""The dsv4bench command line: one root app, one module per command group."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.markup import escape

from dsv4bench import __version__
from dsv4bench.cli.common import EXIT_USAGE, UsageProblem, console, fail

# Each module has register(app). A group whose optional dependency is missing on this machine
# (asyncssh for `remote` on a bare GPU host, say) must not take the other commands down.
COMMAND_MODULES = ("listing", "sweep", "repro", "layouts", "cache", "env", "report", "remote", "model", "regressions")

app = typer.Typer(
    name="dsv4bench", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Correctness-and-tuning workbench for the CuTeDSL kernels of DeepSeek-V4.",
    context_settings={"help_option_names": ["-h", "--help"]},  # sub-commands inherit both spellings
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dsv4bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="print the dsv4bench version and exit")) -> None:
    pass  # the options of the root command; its help is the Typer's


def _unavailable(name: str, error: ImportError) -> None:
    why = f"'dsv4bench {name}' is unavailable here: {error} (pip install the missing package)"

    @app.command(name, help=f"[unavailable: {error}]", context_settings={"allow_extra_args": True,
                                                                        "ignore_unknown_options": True})
    def _stub(ctx: typer.Context) -> None:
        fail(why)


for _name in COMMAND_MODULES:
    try:
        importlib.import_module(f"dsv4bench.cli.{_name}").register(app)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("dsv4bench.cli."):
            continue  # a command group not in this tree
        _unavailable(_name, e)


def main() -> None:
    try:
        app()
    except UsageProblem as e:
        # user text may hold brackets ([hosts.a]): escape it; never wrap the one line
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)
