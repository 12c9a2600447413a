"""Quant on the CPU: the tiling invariants of the kernel, the configs it refuses, and the torch peer
(the low-precision reference) bit-exact against the FP32 oracle, production and hypothesis cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family
from kernels.quant.quant import VEC, QuantConfig
from sweeps import quant as qspace
from tests.reference import run_reference

@given(fmt=st.sampled_from(["fp8", "mxfp4"]), k=st.integers(1, 128), block=st.sampled_from([32, 64, 128]))
def test_quant_tiling_covers_each_row_once_with_aligned_block_groups(fmt, k, block):
    block = 32 if fmt == "mxfp4" else block
    cfg = QuantConfig.make(fmt, block * k, block)
    rows, cols = cfg.tiler(VEC)
    assert cols >= cfg.n > cols - VEC * cfg.threads_per_row  # no wholly idle pass over the row
    assert cfg.threads_per_row % cfg.lanes_per_block == 0  # a block's lanes share one shuffle group
    assert cfg.threads_per_row * rows == cfg.threads and cfg.threads <= 1024


def test_quant_config_refuses_what_the_kernel_cannot_do():
    for bad in [("fp8", 100, 128), ("mxfp4", 128, 64), ("fp8", 128, 48), ("fp8", 128, 512)]:
        with pytest.raises(ValueError):
            QuantConfig.make(*bad)
    with pytest.raises(ValueError):
        QuantConfig.make("mxfp4", 256, 32, rotate=True)


QUANT_CASES = [qspace.fp8(37, 7168), qspace.fp8(5, 448, 64, 512), qspace.fp8(1, 128),
               qspace.mxfp4(130), qspace.mxfp4(3, 96, rotate=False)]


@pytest.mark.parametrize("params", QUANT_CASES, ids=lambda p: f"{p['fmt']}-{p['m']}x{p['n']}-b{p['block']}")
def test_quant_peer_is_bit_exact_against_the_oracle(params):
    data, metrics = run_reference(Case("quant", params, 3))
    codes, scales = data.oracle["codes"], data.oracle["scales"]
    assert len(torch.unique(codes)) > 16 and len(torch.unique(scales)) >= min(3, scales.numel())  # formats exercised
    assert all(m.mismatches == 0 for m in metrics.values())


def test_quant_inputs_reach_both_amax_floors():
    data = CaseData(get_family("quant"), Case("quant", qspace.mxfp4(9, 64, rotate=False), 1), "cpu")
    scales = data.oracle["scales"]
    assert int(scales.min()) == 127 - 126  # the all-zero row: scale 2^-126 (FP4 floor)
    data = CaseData(get_family("quant"), Case("quant", qspace.fp8(9, 256), 1), "cpu")
    assert int(data.oracle["scales"][0].max()) == 127 - 22  # the tiny row: 2^ceil(log2(1e-4/448)) = 2^-22


@given(params=qspace.extra_strategy())
def test_quant_hypothesis_cases_pass_on_cpu(params):
    if params["m"] * params["stride"] > 2_000_000:
        params = {**params, "m": 7}
    run_reference(Case("quant", params, 0))
