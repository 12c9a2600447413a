"""`dsv4bench env`: GPU, driver, clocks, CUDA and library versions."""

from __future__ import annotations

import typer
from rich.table import Table

from dsv4bench.cli.common import console
from dsv4bench.cli.jsonout import JSON_OPTION, print_json
from dsv4bench.core.environment import describe_environment


def env_cmd(as_json: bool = JSON_OPTION) -> None:
    """Print the GPU, driver, clocks, CUDA and library versions of this machine."""
    env = describe_environment()
    if as_json:  # the record a sweep stores in run.json: "gpu" is null without one
        print_json(env)
        return
    table = Table(title="dsv4bench environment", show_header=False)
    gpu = env.pop("gpu") or {"gpu": "none (compile-only; kernels compile for sm_90a and sm_100a)"}
    packages = env.pop("packages")
    for k, v in {**env, **gpu}.items():
        table.add_row(k, str(v))
    for k, v in packages.items():
        table.add_row(k, v)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
