"""`write_report(RUN_DIR)`: results.csv plus one self-contained index.html, optionally against
another run."""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.core.results import ResultRecord, flatten
from dsv4bench.report import plots, speedup, tables
from dsv4bench.report.against import Comparison, compare_runs
from dsv4bench.report.axes import heatmap_axes
from dsv4bench.report.html import render_html
from dsv4bench.report.methodology import methodology
from dsv4bench.report.rundata import Run, load_run
from dsv4bench.report.verdict import MAX_NOISE, THRESHOLD

INDEX = "index.html"


@dataclass
class Report:
    index: Path
    csv: Path
    comparison: Comparison | None
    speed: speedup.Speed | None


def _by(records: list[ResultRecord], key) -> dict[str, list[ResultRecord]]:
    groups: dict[str, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return groups


def heatmaps(records: list[ResultRecord], axes: tuple[str, ...] | None) -> list[dict]:
    out = []
    for family, recs in sorted(_by(records, lambda r: r.family).items()):
        compared = [r for r in recs if r.metrics]
        xy = heatmap_axes(family, compared, axes) if compared else None
        if xy is None:
            continue
        for col, group in sorted(_by(compared, tables.column).items()):
            title = f"{family} · {col} · {xy[0]} × {xy[1]}" if xy[1] else f"{family} · {col} · {xy[0]}"
            uri = plots.error_heatmap(group, xy[0], xy[1], title)
            if uri:
                out.append({"title": title, "uri": uri})
    return out


def perf_sections(records: list[ResultRecord], colours: dict[str, str]) -> list[dict]:
    sections = []
    for family, recs in sorted(_by(records, lambda r: r.family).items()):
        rows = tables.perf_rows(recs)
        if rows:
            sections.append({"family": family, "rows": rows,
                             "roofline": plots.roofline_plot(recs, f"{family}: roofline (measured ceilings)", colours),
                             "bars": plots.limit_bars(rows, f"{family}: % of the measured limit per shape", colours)})
    return sections


def write_csv(run: Run) -> Path:
    """results.csv: every field of every record (core.results.flatten, which read_csv reverses),
    plus on our rows `<peer>_ms` and `speedup_vs_<peer>` (peer ms / ours ms, > 1: ours faster) and on
    every timed row `noisy` (timing spread above speedup.NOISY_CV). read_csv ignores the added columns."""
    derived = speedup.csv_columns(run.records)
    rows = [{**flatten(r), **({"noisy": str(speedup.is_noisy(r))} if r.timing else {}),
             **{k: repr(v) for k, v in derived.get(r.task, {}).items()}} for r in run.records]
    columns = list(dict.fromkeys(c for row in rows for c in row))
    tmp = run.dir.csv.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(run.dir.csv)
    return run.dir.csv


def context(run: Run, comparison: Comparison | None, axes: tuple[str, ...] | None, new_regressions: int,
            speed: speedup.Speed | None) -> dict:
    records, meta, env = run.records, run.meta, run.environment
    colours = plots.impl_colours(records)
    gpu = env.get("gpu") or {}
    failures = tables.failures(records, run.path)
    compile_rows = tables.compile_rows(records)
    cases = tables.case_order(records)
    return {
        "kernel": meta.get("kernel") or ", ".join(sorted({r.family for r in records})) or "?",
        "run_id": run.dir.run_id, "seed": meta.get("seed", "?"), "started": meta.get("started", ""),
        "commit": env.get("commit") or "unknown", "command": meta.get("command", ""),
        "device": gpu.get("name") or "no GPU (compile-only)",
        "counts": tables.status_counts(records), "n_cases": len(cases), "n_records": len(records),
        "origins": sorted(Counter(c.origin for c in cases).items()),
        "failures": failures, "failing_cases": len({f["case_id"] for f in failures}),
        "new_regressions": new_regressions, "comparison": comparison, "threshold": THRESHOLD, "max_noise": MAX_NOISE,
        "heatmaps": heatmaps(records, axes), "perf_sections": perf_sections(records, colours),
        "speed": speed, "noisy_cv": speedup.NOISY_CV, "colours": colours, "speedup_class": tables.speedup_class,
        "unsupported": tables.unsupported(records),
        "compile_rows": compile_rows, "compile_summary": tables.compile_summary(compile_rows),
        "matrix": tables.status_matrix(records), "method": methodology(meta, records),
    }


def write_report(path: str | Path, against: str | Path | None = None, axes: tuple[str, ...] | None = None,
                 new_regressions: int = 0) -> Report:
    """Raises NotARunDir for a bad RUN_DIR or --against, BadAxes for axes the cases lack."""
    run = load_run(path)
    comparison = None
    if against is not None:
        base = load_run(against)
        comparison = compare_runs(base.records, run.records, str(base.path))
    csv_path = write_csv(run)
    speed = speedup.speed(run.records)
    html = render_html(context(run, comparison, axes, new_regressions, speed))
    index = run.path / INDEX
    tmp = index.with_suffix(".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(index)
    return Report(index, csv_path, comparison, speed)
