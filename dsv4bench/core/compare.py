"""Scoring an output against the FP32 oracle with the docs/benchmarking.md rule.

A float output passes only when all hold:
1. no NaN/Inf where the oracle has none;
2. max|out - oracle| <= ratio * max|lowprec - oracle| + atol_floor, where atol_floor is the
   rounding noise of one operation at the output's magnitude (FlashAttention's rule);
3. ||out - oracle|| / ||oracle|| <= rel_l2;
4. the output is not degenerate (all zeros where the oracle is not, or never written).
Integer outputs compare exactly, or as sets per row (top-k indices).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from dsv4bench.core.registry import Tolerance


@dataclass
class ErrorMetrics:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    max_abs: float = 0.0
    mean_abs: float = 0.0
    rel_l2: float = 0.0
    lowprec_max_abs: float | None = None
    bound: float | None = None  # the allowed max_abs
    worst_index: list[int] | None = None
    worst_out: float | None = None
    worst_oracle: float | None = None
    mismatches: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.passed:
            return f"max {self.max_abs:.3g} <= {self.bound if self.bound is not None else 0:.3g}, rel {self.rel_l2:.2g}"
        return "; ".join(self.reasons)


def rounding_floor(oracle: torch.Tensor, dtype: torch.dtype) -> float:
    """The rounding noise of one operation at the output's magnitude: one ulp of `dtype` at
    max|oracle| (twice the worst rounding error of a single op). FlashAttention's
    (o + 0.3 - 0.3) - o form is tuned to outputs of order 1 and vanishes for large ones."""
    if not oracle.numel() or not dtype.is_floating_point:
        return 0.0
    finite = oracle[torch.isfinite(oracle)]
    top = float(finite.abs().max()) if finite.numel() else 0.0
    if top == 0.0:
        return 0.0
    return math.ldexp(torch.finfo(dtype).eps, math.frexp(top)[1] - 1)


def _worst(diff: torch.Tensor) -> list[int]:
    flat = int(torch.argmax(diff))
    return [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)]


def compare_exact(out: torch.Tensor, oracle: torch.Tensor) -> ErrorMetrics:
    if out.shape != oracle.shape:
        return ErrorMetrics(False, [f"shape {tuple(out.shape)} != oracle {tuple(oracle.shape)}"])
    neq = out != oracle
    bad = int(neq.sum())
    m = ErrorMetrics(bad == 0, mismatches=bad)
    if bad:
        idx = _worst(neq.to(torch.uint8))
        m.worst_index, m.worst_out, m.worst_oracle = idx, float(out[tuple(idx)]), float(oracle[tuple(idx)])
        m.reasons.append(f"{bad} of {out.numel()} elements differ (first at {idx})")
    return m


def compare_index_sets(out: torch.Tensor, oracle: torch.Tensor, scores: torch.Tensor | None = None,
                       low: torch.Tensor | None = None, near: float = 0.0) -> ErrorMetrics:
    """Rows of indices compared as sets (order free); -1 marks an empty slot in both. Rows may be
    empty (a top-k over no entries). With `scores` (the oracle's, [rows, S]) and `low` (the
    low-precision reference's), a row may differ by near-ties (`_near_ties`)."""
    if out.shape != oracle.shape:
        return ErrorMetrics(False, [f"shape {tuple(out.shape)} != oracle {tuple(oracle.shape)}"])
    rows = (math.prod(out.shape[:-1]), out.shape[-1])
    a = torch.sort(out.reshape(rows), dim=-1).values
    b = torch.sort(oracle.reshape(rows), dim=-1).values
    bad_rows = torch.nonzero((a != b).any(dim=-1)).flatten().tolist()
    swapped = 0
    if scores is not None and bad_rows:
        sc = scores.reshape(rows[0], -1).float()
        lo = sc if low is None else low.reshape(rows[0], -1).float()
        verdicts = [(r, _near_ties(a[r], b[r], sc[r], lo[r], near)) for r in bad_rows]
        swapped = sum(1 for _, why in verdicts if why is None)
        bad_rows = [(r, why) for r, why in verdicts if why is not None]
    else:
        bad_rows = [(r, "a different index set") for r in bad_rows]
    m = ErrorMetrics(not bad_rows, mismatches=len(bad_rows))
    if swapped:
        m.reasons.append(f"{swapped} rows differ from the oracle only by near-ties")
    if bad_rows:
        row, why = bad_rows[0]
        m.worst_index = [row]
        m.reasons.append(f"{len(bad_rows)} of {a.shape[0]} rows select a different index set (first row {row}: {why})")
    return m


def _near_ties(out: torch.Tensor, ref: torch.Tensor, sc: torch.Tensor, low: torch.Tensor, near: float) -> str | None:
    """None if the sorted index rows `out` and `ref` (-1 = empty) differ only where scores sit within
    eps of the oracle's threshold (its lowest selected score): every index only `out` selects scores
    at least threshold - eps, every one only `ref` selects at most threshold + eps, as many of each.
    eps = near x the row's largest |low - sc| over finite scores + 4 fp32 ulps of its largest |sc|.
    Else why not."""
    n = sc.shape[0]
    o, r = out[out >= 0], ref[ref >= 0]
    if o.numel() != r.numel():
        return f"{o.numel()} indices selected, the oracle {r.numel()}"
    if o.numel() and (int(o.max()) >= n or bool((o[1:] == o[:-1]).any())):
        return "an index out of range or repeated"
    finite = torch.isfinite(sc) & torch.isfinite(low)
    err = float((low - sc)[finite].abs().max()) if bool(finite.any()) else 0.0
    big = float(sc[torch.isfinite(sc)].abs().max()) if bool(torch.isfinite(sc).any()) else 0.0
    eps = near * err + 4 * torch.finfo(torch.float32).eps * big
    thr = float(sc[r].min())
    only_out = o[~torch.isin(o, r)]
    only_ref = r[~torch.isin(r, o)]
    if only_out.numel() and float(sc[only_out].min()) < thr - eps:
        i = int(only_out[sc[only_out].argmin()])
        return f"index {i} scores {float(sc[i]):.6g}, below the threshold {thr:.6g} by more than {eps:.3g}"
    if only_ref.numel() and float(sc[only_ref].max()) > thr + eps:
        i = int(only_ref[sc[only_ref].argmax()])
        return f"index {i} (score {float(sc[i]):.6g}) left out, above the threshold {thr:.6g} by more than {eps:.3g}"
    return None


def compare_float(
    out: torch.Tensor, oracle: torch.Tensor, lowprec: torch.Tensor | None, tol: Tolerance
) -> ErrorMetrics:
    if out.shape != oracle.shape:
        return ErrorMetrics(False, [f"shape {tuple(out.shape)} != oracle {tuple(oracle.shape)}"])
    # fp32 differences are exact enough for bf16/fp16/fp32 outputs and halve the memory of fp64
    wide = torch.float64 if torch.float64 in (out.dtype, oracle.dtype) else torch.float32
    o64, r64 = out.to(wide), oracle.to(wide)
    m = ErrorMetrics(True)
    finite_ref = torch.isfinite(r64)
    nonfinite = ~torch.isfinite(o64) & finite_ref
    if bool(nonfinite.any()):
        m.passed = False
        m.mismatches = int(nonfinite.sum())
        m.worst_index = _worst(nonfinite.to(torch.uint8))
        m.reasons.append(f"{m.mismatches} NaN/Inf where the oracle is finite (first at {m.worst_index})")
        o64 = torch.where(nonfinite, torch.zeros_like(o64), o64)
    # where the oracle is -inf / +inf / NaN (a masked logit, an empty row's LSE) the output must be too
    special = ~finite_ref & ~((o64 == r64) | (torch.isnan(o64) & torch.isnan(r64)))
    if bool(special.any()):
        m.passed = False
        m.mismatches += int(special.sum())
        at = _worst(special.to(torch.uint8))
        m.reasons.append(f"{int(special.sum())} elements where the oracle is +-inf/NaN differ from it (first at "
                         f"{at}: out {float(out[tuple(at)]):.6g}, oracle {float(oracle[tuple(at)]):.6g})")
    diff = torch.where(finite_ref, (o64 - r64).abs(), torch.zeros_like(o64))
    m.max_abs = float(diff.max()) if diff.numel() else 0.0
    m.mean_abs = float(diff.mean()) if diff.numel() else 0.0
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite_ref, r64, torch.zeros_like(r64))))
    m.rel_l2 = float(torch.linalg.vector_norm(diff)) / ref_norm if ref_norm > 0 else m.max_abs
    if diff.numel():
        idx = _worst(diff)
        m.worst_index, m.worst_out, m.worst_oracle = idx, float(out[tuple(idx)]), float(oracle[tuple(idx)])

    floor = rounding_floor(oracle, out.dtype if out.dtype.is_floating_point else torch.float32)
    if lowprec is not None and r64.numel():
        m.lowprec_max_abs = float(
            torch.where(finite_ref, (lowprec.to(wide) - r64).abs(), torch.zeros_like(r64)).max()
        )
        m.bound = tol.ratio * m.lowprec_max_abs + floor
    else:
        m.bound = floor
    if m.max_abs > m.bound:
        m.passed = False
        m.reasons.append(
            f"max|err| {m.max_abs:.4g} > bound {m.bound:.4g} at {m.worst_index} "
            f"(out {m.worst_out:.6g}, oracle {m.worst_oracle:.6g})"
        )
    if m.rel_l2 > tol.rel_l2:
        m.passed = False
        m.reasons.append(f"relative L2 {m.rel_l2:.3g} > {tol.rel_l2:g}")
    if ref_norm > 0 and float(torch.linalg.vector_norm(o64)) == 0.0:
        m.passed = False
        m.reasons.append("degenerate output: all zeros")
    return m


def _compare_one(out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor | None, tol, scores=None) -> ErrorMetrics:
    if tol.index_set:
        return compare_index_sets(out, ref, *(scores or (None, None)), tol.near)
    if tol.exact or not out.dtype.is_floating_point:
        return compare_exact(out, ref)
    return compare_float(out, ref, low, tol)


def by_ids(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each row of `values` in the ascending order of the same row of `ids` (Tolerance.paired_with)."""
    return values.gather(-1, ids.to(values.device).long().argsort(dim=-1, stable=True))


def compare_outputs(
    outputs: dict, oracle: dict, lowprec: dict | None, tol_for
) -> tuple[bool, dict[str, ErrorMetrics]]:
    """Compare every output the oracle defines; `tol_for(name)` gives each one's Tolerance. The
    comparison runs where the output is (a GPU compares a 16384 x 65536 output in well under a
    second; the host took ~40 s), on the host if the device runs out of memory for it."""
    metrics: dict[str, ErrorMetrics] = {}
    for name, ref in oracle.items():
        tol = tol_for(name)
        if tol.aux:
            continue
        if name not in outputs:
            metrics[name] = ErrorMetrics(False, [f"output '{name}' missing"])
            continue
        out = outputs[name].detach()
        low = lowprec.get(name) if lowprec and name in lowprec else None
        if tol.paired_with and tol.paired_with in outputs:
            out, ref = by_ids(out, outputs[tol.paired_with]), by_ids(ref, oracle[tol.paired_with])
            low = None if low is None else by_ids(low, lowprec[tol.paired_with])
        for dev in dict.fromkeys((out.device, torch.device("cpu"))):
            try:
                scores = None
                if tol.scores:  # the oracle's scores, and the low-precision reference's where it has them
                    low_sc = (lowprec or {}).get(tol.scores)
                    scores = (oracle[tol.scores].detach().to(dev), None if low_sc is None else low_sc.detach().to(dev))
                metrics[name] = _compare_one(out.to(dev), ref.detach().to(dev),
                                             None if low is None else low.detach().to(dev), tol, scores)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
    return all(m.passed for m in metrics.values()), metrics
