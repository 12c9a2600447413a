"""The tables of `run-model --compare` and `run-model --bisect` (dsv4bench/model/diff.py, bisect.py)."""

from __future__ import annotations

from rich.table import Table

from dsv4bench.cli.common import console


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _err(e) -> str:
    """An Error: the relative L2 error of the floating outputs, and/or the share of index rows that differ."""
    if e is None:
        return ""
    parts = ([_num(e.rel)] if e.rel is not None else []) + ([f"{e.mismatch:.1%} rows"] if e.mismatch is not None else [])
    return " · ".join(parts) or "-"


def show_compare(report, backend: str) -> None:
    """Per layer and op: the op output's error; per layer: the residual stream's; then the logits."""
    ops = Table(title=f"--compare: --backend {backend} against the FP32 oracle model, op by op (relative L2 "
                      "error over every call; index rows compared as sets)")
    for col in ("scope", "op", "backend", "calls", "vs the oracle run", "own (same inputs)"):
        ops.add_column(col, justify="left" if col in ("scope", "op", "backend") else "right")
    for r in report.ops:
        be = r.backend if r.backend == "oracle" else f"[bold]{r.backend}[/]"
        ops.add_row(r.scope, r.op, be, str(r.calls), _err(r.error), _err(r.local))
    console.print(ops)
    low = report.bound
    resid = Table(title="residual stream (relative L2 error vs FP32)"
                        + ("; the low-precision torch model on the same tokens beside it" if low else ""))
    cols = ("layer", "after attention", "after the layer") + (("lowprec: after attention", "after the layer",
                                                                 "within lowprec's") if low else ())
    for col in cols:
        resid.add_column(col, justify="left" if col == "layer" else "right")
    within = report.within_bound() if low else []
    for i, (scope, attn, layer) in enumerate(report.residual):
        extra = (_num(low.residual[i][1]), _num(low.residual[i][2]),
                 "yes" if within[i] else f"[bold red]no[/] ({layer / low.residual[i][2]:.3f}x)") if low else ()
        resid.add_row(scope, _num(attn), _num(layer), *extra)
    console.print(resid)
    summary = Table(title="logits", show_header=False)
    summary.add_row("teacher-forced positions", str(report.positions))
    summary.add_row("top-1 agreement", f"{report.top1:.2%}" + (f" (lowprec {low.top1:.2%})" if low else ""))
    summary.add_row("relative L2 error", _num(report.logits_rel) + (f" (lowprec {_num(low.logits_rel)})" if low else ""))
    d = report.divergence
    if d is None:
        summary.add_row("greedy generation", f"the same {report.steps} tokens")
    else:
        summary.add_row("greedy generation", f"first differs at step {d.step}: oracle {d.oracle_token}, "
                        f"{backend} {d.candidate_token}; oracle margin {d.margin:.3g} "
                        f"(logits std {d.spread:.3g})")
    console.print(summary)


def show_bisect(verdicts, named: str | None, backend: str, factor: float) -> None:
    table = Table(title=f"--bisect: one op at a time on --backend {backend}, every other op on its oracle "
                        "(op error: against its oracle on the same inputs)")
    for col in ("op", "op error", "bf16 floor", "ratio", "model error", ""):
        table.add_column(col, justify="left" if col in ("op", "") else "right")
    for v in verdicts:
        ratio = "-" if not v.error else ("inf" if not v.floor else f"{v.error / v.floor:.1f}")
        table.add_row(v.op, _num(v.error), _num(v.floor), ratio, _num(v.model), "[bold red]jumps[/]" if v.jumps else "")
    console.print(table)
    if named:
        console.print(f"first op whose error jumps (> {factor:g}x its bf16 floor): [bold]{named}[/]")
    else:
        console.print(f"no op's error exceeds {factor:g}x its bf16 floor")
