"""Numbers derived from one ResultRecord for the report: error ratios and the roofline position.

% of the limit is against the device's *measured* ceilings stored in the record (copy bandwidth
and dense bf16 GEMM throughput, taken in the same run): the attainable TFLOP/s at the case's
arithmetic intensity is min(GEMM TFLOP/s, copy GB/s x intensity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4bench.core.results import ResultRecord

OURS = "cutedsl"


def shape(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def worst(values) -> float | None:
    """The largest of the errors, NaN above all (a NaN error is no better than inf); None for none."""
    vals = list(values)
    if not vals:
        return None
    return math.nan if any(math.isnan(v) for v in vals) else max(vals)


def _ratio(m: dict) -> float:
    if m.get("bound"):
        return (m.get("max_abs") or 0.0) / m["bound"]
    if m.get("bound") == 0 and m.get("max_abs"):
        return math.inf
    return 0.0 if m.get("passed", True) else math.inf


def error_ratio(rec: ResultRecord) -> float | None:
    """Worst max|err| / bound over the outputs (pass <= 1); inf for an exact-compare mismatch,
    NaN for a NaN error; None when the record was not compared."""
    return worst(_ratio(m) for m in (rec.metrics or {}).values())


def rel_l2(rec: ResultRecord) -> float | None:
    return worst(m["rel_l2"] for m in (rec.metrics or {}).values() if m.get("rel_l2") is not None)


@dataclass(frozen=True)
class Roofline:
    intensity: float  # flop / byte
    tflops: float
    gbps: float
    attainable_tflops: float
    pct_limit: float
    bound: str  # memory | compute
    gemm_tflops: float
    copy_gbps: float


def roofline(rec: ResultRecord) -> Roofline | None:
    p = rec.perf or {}
    need = ("tflops", "gbps", "copy_gbps_measured", "gemm_tflops_measured")
    if any(not isinstance(p.get(k), (int, float)) for k in need) or p["gbps"] <= 0:
        return None
    intensity = 1e3 * p["tflops"] / p["gbps"]
    mem_limit = p["copy_gbps_measured"] * intensity / 1e3
    attainable = min(p["gemm_tflops_measured"], mem_limit)
    memory_bound = mem_limit < p["gemm_tflops_measured"]
    # memory-bound: tflops / attainable = gbps / copy bandwidth, which also holds for an op of no flops
    pct = p["gbps"] / p["copy_gbps_measured"] if memory_bound else p["tflops"] / attainable
    return Roofline(intensity, p["tflops"], p["gbps"], attainable, 100.0 * pct,
                    "memory" if memory_bound else "compute", p["gemm_tflops_measured"], p["copy_gbps_measured"])
