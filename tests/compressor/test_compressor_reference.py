"""The compressor on the CPU: the low-precision reference passes the tolerance rule against the FP32 oracle
with a non-zero error (the bound is not only a floor), wrong answers fail it, and the sweep space holds
the production and ragged shapes."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, get_family
from tests.reference import check_reference
from tests.compressor.fp8_grid import off_grid

CASES = [
    {"m": 4, "b": 2, "s": 43, "d": 512, "dtype": "bf16"},
    {"m": 128, "b": 1, "s": 300, "d": 512, "dtype": "bf16"},
]


@pytest.mark.parametrize("params", CASES, ids=str)
def test_lowprec_reference_passes_the_rule(params):
    ok, metrics, _ = check_reference(Case("compressor", params, 4))
    print(params, {k: m.summary() for k, m in metrics.items()})
    assert ok
    assert any(m.max_abs > 0 for m in metrics.values()), "lowprec equal to the oracle: the bound is only a floor"


def test_compressor_outputs_sit_on_the_fp8_grid_and_a_missing_qdq_is_caught():
    fam = get_family("compressor")
    case = Case("compressor", {"m": 4, "b": 1, "s": 64, "d": 512, "dtype": "bf16"}, 5)
    data = CaseData(fam, case, "cpu")
    assert off_grid(data.oracle["nope"]) == 0 and off_grid(data.lowprec["nope"]) == 0
    rope_only = fam.lowprec(case, data.inputs)["nope"]
    unquantised = rope_only + torch.rand_like(rope_only.float()).to(rope_only.dtype) * 1e-2
    assert off_grid(unquantised) > unquantised.numel() // 2


def test_sweep_space_holds_production_and_ragged_shapes():
    cases = get_family("compressor").cases(SweepOptions(examples=5, seed=0))
    assert {(16384, 4), (16384, 128), (1001, 4)} <= {(c["s"], c["m"]) for c in cases}
    assert sum(c.origin == "hypothesis" for c in cases) >= 3
