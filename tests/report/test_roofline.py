"""The roofline of one record (dsv4bench/report/derived.py): percent of the binding limit, for ops
with flops and for byte-only ops (the indexer top-k records 0 flops)."""

from __future__ import annotations

import random

import pytest

from dsv4bench.report.derived import roofline
from tests.report.report_synth import COPY_GBPS, GEMM_TFLOPS, cases, record


def _rec(tflops: float, gbps: float):
    rec = record("r", cases(1)[0], "cutedsl", "cutedsl", 1.0, False, random.Random(0))
    rec.perf = dict(rec.perf, tflops=tflops, gbps=gbps)
    return rec


def test_memory_bound_percent_is_bandwidth_over_copy():
    r = roofline(_rec(0.5, 0.4 * COPY_GBPS))  # 1.25 flop / byte: far below the ridge
    assert r.bound == "memory"
    assert r.pct_limit == pytest.approx(40.0)


def test_compute_bound_percent_is_tflops_over_gemm():
    r = roofline(_rec(0.6 * GEMM_TFLOPS, 100.0))
    assert r.bound == "compute"
    assert r.pct_limit == pytest.approx(60.0)


def test_an_op_of_no_flops_is_memory_bound_with_its_bandwidth_share():
    r = roofline(_rec(0.0, 0.25 * COPY_GBPS))
    assert r.bound == "memory" and r.intensity == 0.0
    assert r.pct_limit == pytest.approx(25.0)


def test_the_roofline_plot_leaves_out_ops_of_no_flops():
    from dsv4bench.report.plots import roofline_plot

    assert roofline_plot([_rec(0.0, 1000.0)], "top-k", {"cutedsl": "#000"}) is None
    assert roofline_plot([_rec(0.0, 1000.0), _rec(0.5, 400.0)], "mixed", {"cutedsl": "#000"}).startswith("data:")
