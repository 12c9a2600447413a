"""Synthetic run directories: what a GPU sweep with --bench writes, made on a CPU box.

Shapes follow an attention-like family (hd x s_kv) so heatmaps have two axes; every case has
our CuTeDSL impl and two peers, with timing samples, derived perf and the measured ceilings.
Cases at the `failing` indices fail numerically in our impl (error above its bound).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from dsv4bench.core.case import Case
from dsv4bench.core.results import FAIL_NUMERIC, PASS, ResultRecord, RunDir
from dsv4bench.core.timing import summarize

FAMILY = "synthattn"
IMPLS = (("cutedsl", "cutedsl", 1.0), ("flashmla", "flashmla", 1.25), ("torch", "torch", 9.0))
COPY_GBPS, GEMM_TFLOPS = 2970.0, 795.0


def cases(n: int, seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        params = {"hd": rng.choice([64, 128, 256, 512]), "s_kv": rng.choice([1, 63, 64, 65, 517, 4096, 8192]),
                  "h_q": rng.choice([64, 128]), "s_q": 1 + i}  # s_q makes every case distinct
        out.append(Case(FAMILY, params, seed, "grid" if i % 3 else "hypothesis"))
    return out


def record(run_id: str, case: Case, impl: str, backend: str, slowdown: float, failing: bool, rng: random.Random,
           jitter: float = 0.02) -> ResultRecord:
    p = case.params
    flops = 4.0 * p["s_q"] * p["h_q"] * p["s_kv"] * p["hd"]
    nbytes = 2.0 * (p["s_q"] * p["h_q"] * p["hd"] * 2 + p["s_kv"] * p["hd"])
    ideal_ms = max(flops / (GEMM_TFLOPS * 1e12), nbytes / (COPY_GBPS * 1e9)) * 1e3
    base = (ideal_ms * 1.4 + 0.004) * slowdown
    stats = summarize([base * (1 + rng.gauss(0, jitter)) for _ in range(30)], True)
    sec = stats.median_ms / 1e3
    bound = 0.004
    max_abs = bound * (3.5 if failing else rng.uniform(0.05, 0.9))
    metrics = {"out": {"passed": not failing, "reasons": ["max|err| above bound"] if failing else [],
                       "max_abs": max_abs, "mean_abs": max_abs / 17, "rel_l2": max_abs / 2.3,
                       "lowprec_max_abs": bound / 2, "bound": bound, "worst_index": [0, p["s_q"] - 1, 3],
                       "worst_out": 0.5 + max_abs, "worst_oracle": 0.5, "mismatches": 0}}
    return ResultRecord(
        run_id=run_id, task=f"{case.id}|{impl}|sm_90a|run", case_id=case.id, family=FAMILY, impl=impl,
        backend=backend, arch="sm_90a", mode="run", device="cuda", params=dict(p), seed=case.seed,
        origin=case.origin, status=FAIL_NUMERIC if failing else PASS,
        reason=f"max|err| {max_abs:.4g} > bound {bound:.4g}" if failing else "ok", metrics=metrics,
        timing=None if failing else stats.to_json(),
        perf=None if failing else {
            "tflops": flops / sec / 1e12, "gbps": nbytes / sec / 1e9,
            "pct_copy": 100 * nbytes / sec / 1e9 / COPY_GBPS, "pct_gemm": 100 * flops / sec / 1e12 / GEMM_TFLOPS,
            "copy_gbps_measured": COPY_GBPS, "gemm_tflops_measured": GEMM_TFLOPS},
    )


def make_run(path: Path, n_cases: int, failing: tuple[int, ...] = (0, 1), seed: int = 0, slow: float = 1.0,
             jitter: float = 0.02) -> tuple[RunDir, list[Case]]:
    """A run directory with `n_cases` cases x 3 impls; the cases at the `failing` indices fail
    in ours; `slow` scales our impl's time (for A/B runs)."""
    rng = random.Random(seed + 1)
    run = RunDir(path).create()
    cs = cases(n_cases)
    run.write_meta({
        "command": f"dsv4bench sweep {FAMILY} --bench --seed 0", "kernel": FAMILY, "seed": 0,
        "examples": n_cases, "archs": ["sm_90a"], "gpu": True, "started": "2026-11-22 05:00:00",
        "environment": {"python": "3.11.7", "host": "gpu-host", "commit": "abc1234",
                        "packages": {"torch": "2.11.0", "nvidia-cutlass-dsl": "4.8.1"}, "cuda_runtime": "13.0",
                        "gpu": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132,
                                "driver_version": "580.65", "clocks.sm": "1980", "clocks.max.sm": "1980"}},
        "cases": {c.id: c.to_json() for c in cs},
    })
    records = [record(path.name, case, impl, backend, factor * (slow if backend == "cutedsl" else 1.0),
                      failing=backend == "cutedsl" and i in failing, rng=rng, jitter=jitter)
               for i, case in enumerate(cs) for impl, backend, factor in IMPLS]
    run.results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))  # as appended, in one write
    return run, cs
