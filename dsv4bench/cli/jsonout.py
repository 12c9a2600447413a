"""`--json` on the read-only commands: one JSON document on stdout and nothing else (docs/cli.md)."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

JSON_OPTION = typer.Option(False, "--json", help="print machine-readable JSON on stdout instead of tables")


def print_json(doc: Any) -> None:
    """Write `doc` as indented JSON (paths and other objects as strings) to stdout, bypassing rich."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()
