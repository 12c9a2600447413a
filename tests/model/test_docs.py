"""docs/model.md documents every op of the dispatch table with its oracle; docs/model-runner.md every run-model option."""

import re
from pathlib import Path

from dsv4bench.model.dispatch import OPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "model.md"


def test_every_op_is_documented_with_its_oracle():
    rows = dict(re.findall(r"^\| `(\w+)` \| `([\w.]+)` \|", DOC.read_text(), flags=re.M))
    want = {name: f"{info.oracle.__module__}.{info.oracle.__name__}" for name, info in OPS.items()}
    assert rows == want


def test_every_run_model_option_is_in_the_runner_pages_table():
    import typer

    from dsv4bench.cli.model import register

    app = typer.Typer()
    register(app)
    cmd = typer.main.get_command(app).commands["run-model"]
    options = {o for p in cmd.params for o in p.opts if o.startswith("--")} - {"--help"}
    page = (DOC.parent / "model-runner.md").read_text()
    first_cells = [line.split("|")[1] for line in page.splitlines() if line.startswith("| `--")]
    documented = {o for cell in first_cells for o in re.findall(r"`(--[\w-]+)`", cell)}
    assert options and options <= documented, options - documented
