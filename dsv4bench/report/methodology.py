"""The methodology block: how the numbers were made, on what, with which software."""

from __future__ import annotations

import inspect
from collections import Counter

from dsv4bench.core.results import ResultRecord
from dsv4bench.core.timing import (DRIFT_RATIO, FLUSH_MIN_BYTES, TRANSIENT_RATIO, TRANSIENT_RETRIES, WARMUP_MS,
                                   CudaTimer)

CORRECTNESS = (
    "A case passes when the output has no NaN/Inf where the FP32 oracle has none, "
    "max|out - oracle| <= ratio x max|lowprec - oracle| + the rounding noise of one operation, "
    "the relative L2 error is under the family's bound, and the output is not degenerate "
    "(outputs are NaN-poisoned before each run). Without a GPU, CuTeDSL kernels compile for each "
    "arch on fake tensors and the low-precision torch reference is checked against the oracle."
)
GPU_FIELDS = ("name", "capability", "sms", "memory_gib", "l2_mib", "driver_version", "clocks.sm", "clocks.max.sm",
              "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")


def timing_protocol(records: list[ResultRecord]) -> list[str]:
    defaults = {k: p.default for k, p in inspect.signature(CudaTimer.time).parameters.items()
                if p.default is not inspect.Parameter.empty}
    lines = [
        "CUDA events around the call alone; "
        f"a warm-up of flushed calls for at least {WARMUP_MS:g} ms first (at least {defaults['warmup']}; "
        "compilation and module load stay out).",
        f"L2 flushed before every iteration by a memset of max(2 x L2, {FLUSH_MIN_BYTES >> 20} MiB).",
        f"At least {defaults['min_iters']} iterations, more while the coefficient of variation exceeds "
        f"{defaults['target_cv']:.0%}, at most {defaults['max_iters']}; median, p10, p90 and CV recorded; a set "
        f"whose median is above {TRANSIENT_RATIO}x its p10, or whose first quarter's median is above "
        f"{DRIFT_RATIO}x its last quarter's, is taken again (at most {TRANSIENT_RETRIES} times), the lowest median kept.",
        "TFLOP/s and GB/s from the family's cost model (flops, minimum bytes); % of limit against the "
        "ceilings measured in the same run (device-to-device copy, dense bf16 GEMM), never datasheet peaks.",
        "Peers run in the same process on the same device; speed is stated as a ratio to ours.",
    ]
    timed = [r.timing for r in records if r.timing]
    if timed:
        iters = [t.get("n") for t in timed if t.get("n")]
        flush = Counter(bool(t.get("l2_flush")) for t in timed)
        lines.append(f"This run: {len(timed)} timed results, {min(iters, default=0)}-{max(iters, default=0)} "
                     f"iterations each; cold L2 in {flush[True]}, hot cache in {flush[False]}.")
    else:
        lines.append("This run timed nothing (no GPU, or no --bench).")
    return lines


def ceilings(records: list[ResultRecord]) -> dict[str, float]:
    out = {}
    for r in records:
        p = r.perf or {}
        if p.get("copy_gbps_measured"):
            out["device-to-device copy (GB/s)"] = p["copy_gbps_measured"]
        if p.get("gemm_tflops_measured"):
            out["dense bf16 GEMM 8192^3 (TFLOP/s)"] = p["gemm_tflops_measured"]
    return out


def methodology(meta: dict, records: list[ResultRecord]) -> dict:
    env = meta.get("environment") or {}
    gpu = env.get("gpu") or {}
    return {
        "protocol": timing_protocol(records),
        "correctness": CORRECTNESS,
        "device": [(k, gpu[k]) for k in GPU_FIELDS if gpu.get(k) not in (None, "")]
        or [("device", "no GPU (compile-only + CPU oracle checks)")],
        "ceilings": ceilings(records),
        "software": [("commit", env.get("commit")), ("python", env.get("python")),
                     ("CUDA runtime", env.get("cuda_runtime")), ("host", env.get("host")),
                     *sorted((env.get("packages") or {}).items())],
        "sweep": [(k, meta.get(k)) for k in ("command", "kernel", "seed", "examples", "archs", "gpu", "started")
                  if meta.get(k) is not None],
    }
