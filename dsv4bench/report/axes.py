"""Which two params an error heatmap spans: asked for, declared by the family's case space
(`REPORT_AXES = ("hd", "s_kv")` in sweeps/<family>.py), or the two numeric params with the most
distinct values in the run."""

from __future__ import annotations

import importlib

from dsv4bench.core.results import ResultRecord


class BadAxes(ValueError):
    """--axes names a param the run's cases lack (one line for the user, exit 2)."""


def declared(family: str, name: str, default=None):
    """A report setting declared by the family's case space (sweeps/<family>.py), else `default`."""
    try:
        module = importlib.import_module(f"sweeps.{family}")
    except ImportError:
        return default
    return getattr(module, name, default)


def declared_axes(family: str) -> tuple[str, ...] | None:
    axes = declared(family, "REPORT_AXES")
    return tuple(axes) if axes else None


def heatmap_axes(family: str, records: list[ResultRecord], requested: tuple[str, ...] | None = None
                 ) -> tuple[str, str | None] | None:
    """(x, y) or (x, None) for a single numeric param; None when nothing numeric varies. A
    requested axis the records do not have raises BadAxes."""
    present = {k for r in records for k in r.params}
    if requested:
        missing = [a for a in requested if a not in present]
        if missing:
            raise BadAxes(f"{family} cases have no param '{missing[0]}' (they have: {', '.join(sorted(present))})")
        return requested[0], requested[1] if len(requested) > 1 else None
    declared = declared_axes(family)
    if declared and all(a in present for a in declared):
        return declared[0], declared[1] if len(declared) > 1 else None
    distinct: dict[str, set] = {}
    for r in records:
        for k, v in r.params.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                distinct.setdefault(k, set()).add(v)
    ranked = sorted((k for k, vals in distinct.items() if len(vals) > 1), key=lambda k: -len(distinct[k]))
    if not ranked:
        return None
    return ranked[0], ranked[1] if len(ranked) > 1 else None
