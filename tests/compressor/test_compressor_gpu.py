"""The compressor's NoPE values on a GPU: exactly on the FP8 e4m3 grid of their power-of-two scales,
and equal to the oracle's codes but for rounding-midpoint flips (the generic conformance run has
already judged the values by the tolerance rule). Skipped without CUDA."""

from __future__ import annotations

import pytest

from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, get_family
from tests.compressor.fp8_grid import off_grid

pytestmark = [pytest.mark.gpu]
# the main compressor's cases (the indexer's, Hadamard + FP4: tests/compressor/test_compressor_indexer.py)
CASES = [c for c in get_family("compressor").cases(SweepOptions(examples=8, seed=9)) if not c.get("indexer")]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_nope_sits_on_the_fp8_grid(case, gpu_check):
    outcome = gpu_check(case)
    nope = outcome.result["nope"]
    assert off_grid(nope) == 0, "NoPE values off the FP8 grid"
    oracle = CaseData(get_family("compressor"), case, "cuda").oracle["nope"]
    flips = float((nope != oracle.to(nope.dtype)).float().mean())
    print(f"NoPE values differing from the oracle's codes: {flips:.2e}")
    assert flips < 2e-3
