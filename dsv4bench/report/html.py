"""The jinja2 page: one self-contained index.html (inline CSS, figures as data URIs, no URLs)."""

from __future__ import annotations

import math
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _num(v, digits: int = 3) -> str:
    """Display only (the CSV keeps full precision): `digits` significant digits."""
    if v is None or v == "":
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:.{digits}g}"


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:.1f}%"


def _signed_pct(v) -> str:
    return "" if v is None else f"{100 * v:+.1f}%"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters.update(num=_num, pct=_pct, signed_pct=_signed_pct)
    return env


def render_html(context: dict) -> str:
    return _environment().get_template("index.html.j2").render(**context)
