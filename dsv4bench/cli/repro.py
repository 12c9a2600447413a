"""`dsv4bench repro CASE_ID`: replay one case with full diagnostics."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

import torch
import typer
from rich.table import Table

from dsv4bench.cli.common import console, fail, gpu_arch
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData, Outcome, evaluate
from dsv4bench.core.regressions import regressions_dir
from dsv4bench.core.registry import get_family, impls
from dsv4bench.core.results import PASS, UNCHECKED, UNSUPPORTED
from dsv4bench.core.runner import CHECK_IMPL
from dsv4bench.core.worker import Worker

WORST = 8


def find_case(case_id: str, roots: list[Path]) -> tuple[Case, Path, str]:
    """The case as recorded in any run directory under `roots` (newest first), else in a regression
    file; with where it was found and the command that produced it."""
    metas = sorted((p for root in roots if root.exists() for p in root.rglob("run.json")),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for meta in metas:
        d = json.loads(meta.read_text())
        if case_id in d.get("cases", {}):
            return Case.from_json(d["cases"][case_id]), meta.parent, d.get("command", "?")
    for path in sorted(regressions_dir().glob("*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line) if line.strip() else {}
            if entry.get("case_id") == case_id:
                case = Case(path.stem, entry["params"], int(entry.get("seed", 0)), "regression")
                return case, path, f"{entry.get('command', '?')}  ({entry.get('status')} at {entry.get('commit')})"
    fail(f"case '{case_id}' not found in any run directory under {', '.join(map(str, roots))} "
         f"nor in the regression files in {regressions_dir()}")


def error_histogram(out: torch.Tensor, ref: torch.Tensor) -> list[tuple[str, int]]:
    err = (out.double() - ref.double()).abs().flatten()
    edges = [0.0] + [10.0**e for e in range(-8, 2)] + [float("inf")]
    return [(f"[{lo:.0e}, {hi:.0e})", int(((err >= lo) & (err < hi)).sum())) for lo, hi in zip(edges, edges[1:])]


def show_worst(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor | None) -> None:
    diff = (out.double() - ref.double()).abs().nan_to_num(float("inf")).flatten()
    k = min(WORST, diff.numel())
    table = Table(title=f"{name}: worst {k} elements")
    for col in ("coordinates", "out", "oracle", "lowprec", "|out-oracle|"):
        table.add_column(col)
    for flat in torch.topk(diff, k).indices.tolist():
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), out.shape))
        table.add_row(str(list(idx)), f"{float(out[idx]):.6g}", f"{float(ref[idx]):.6g}",
                      f"{float(low[idx]):.6g}" if low is not None else "", f"{float(diff[flat]):.3g}")
    console.print(table)
    hist = Table(title=f"{name}: |out - oracle| histogram")
    hist.add_column("bucket")
    hist.add_column("elements")
    for bucket, n in error_histogram(out, ref):
        if n:
            hist.add_row(bucket, str(n))
    console.print(hist)


def show_outcome(label: str, outcome: Outcome, data: CaseData) -> bool:
    ok = outcome.passed
    colour = {PASS: "green", UNCHECKED: "yellow", UNSUPPORTED: "yellow"}.get(outcome.status, "red")
    console.print(f"[{colour}]{label}: {outcome.status}[/]" + ("" if ok else f" {outcome.reason}"), highlight=False)
    for name, m in outcome.metrics.items():
        console.print(f"  {name}: max {m.max_abs:.4g} mean {m.mean_abs:.4g} rel_l2 {m.rel_l2:.3g} "
                      f"bound {m.bound} worst at {m.worst_index}" + ("" if ok else f"; {m.summary()}"))
        res = outcome.result.get(name)
        if res is not None and res.is_floating_point():
            show_worst(name, res.cpu(), data.oracle[name].cpu(),
                       data.lowprec[name].cpu() if name in data.lowprec else None)
    return ok or outcome.status == UNSUPPORTED


def show_reference_check(data: CaseData, tol) -> bool:
    """What a CPU sweep checks: the low-precision reference against the FP32 oracle."""
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, tol)
    outcome = Outcome(PASS if ok else "FAIL_NUMERIC", "; ".join(m.summary() for m in metrics.values()),
                      metrics, data.lowprec)
    return show_outcome("lowprec reference vs FP32 oracle (CPU check)", outcome, data)


def repro_cmd(
    case_id: str = typer.Argument(..., help="a case id from a sweep's results"),
    runs: Optional[Path] = typer.Option(None, help="run directory root to search (default: reports/)"),
    impl: Optional[str] = typer.Option(None, help="only this impl"),
) -> None:
    """Replay one case: inputs regenerated from its seed, every impl compared with diagnostics.
    Exit status 1 when any comparison fails."""
    case, found, made_by = find_case(case_id, [runs] if runs else [Path("reports")])
    try:
        family = get_family(case.family)
    except KeyError as e:
        fail(e.args[0])
    arch = gpu_arch()
    replay = ["dsv4bench", "repro", case_id] + (["--runs", str(runs.resolve())] if runs else [])
    console.print(f"[bold]{case}[/]\nfound in: {found}\nmade by:  {made_by}\n"
                  f"replay:   {shlex.join(replay + (['--impl', impl] if impl else []))}", highlight=False)
    worker = Worker()
    device = "cuda" if arch else "cpu"
    data = CaseData(family, case, device)
    tol = lambda n: family.tolerance_for(case, n)  # noqa: E731
    passed = True
    if not arch and impl in (None, CHECK_IMPL):
        passed &= show_reference_check(data, tol)
    chosen = [im for im in impls(case.family, variants=True) if (im.name == impl if impl else not im.variant)]
    if impl and not chosen and impl != CHECK_IMPL:
        fail(f"family {case.family} has no impl '{impl}' (impls: "
             f"{', '.join(i.name for i in impls(case.family, variants=True))})")
    for im in chosen:
        if not arch:
            if im.compiles:
                for a in im.archs:
                    try:
                        info = worker.cache.get(im, case, a)[1]
                        console.print(f"{im.name} {a}: COMPILED in {info.seconds:.2f}s, {info.registers} registers, "
                                      f"{info.local_bytes} B local, {info.cubin_bytes} B cubin")
                    except Exception as e:
                        console.print(f"[red]{im.name} {a}: FAIL_COMPILE[/] {type(e).__name__}: {e}")
                        passed = False
                continue
            if im.needs_gpu:
                continue
        reason = im.available() or im.supports(case, arch)
        if reason:
            console.print(f"{im.name}: UNSUPPORTED ({reason})")
            continue
        compiled = worker.cache.get(im, case, arch)[0] if im.compiles else None
        passed &= show_outcome(im.name, evaluate(family, im, case, compiled, device=device, data=data), data)
    if not passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("repro")(repro_cmd)
