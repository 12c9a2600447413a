"""CPU checks of the issue-9a families (rope, mhc, compressor): the low-precision reference passes
the BENCHMARKING rule against the FP32 oracle, and wrong answers fail it (the tests can fail)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, get_family
from dsv4bench.core.worker import CaseData
from tests.compressor.fp8_grid import off_grid

CASES = [
    ("rope", {"op": "q_norm_rope", "t": 37, "h": 3, "n": 512, "table": "yarn", "pos": "decode", "dtype": "bf16"}),
    ("rope", {"op": "inverse", "t": 5, "h": 64, "n": 512, "table": "swa", "pos": "prefill", "dtype": "bf16"}),
    ("rope", {"op": "rope", "t": 9, "h": 64, "n": 128, "table": "yarn", "pos": "decode", "dtype": "fp16"}),
    ("mhc", {"op": "pre", "t": 33, "d": 4096, "dtype": "bf16"}),
    ("mhc", {"op": "post", "t": 3, "d": 7168, "dtype": "bf16"}),
    ("mhc", {"op": "head", "t": 2, "d": 1000, "dtype": "bf16"}),
    ("compressor", {"m": 4, "b": 2, "s": 43, "d": 512, "dtype": "bf16"}),
    ("compressor", {"m": 128, "b": 1, "s": 300, "d": 512, "dtype": "bf16"}),
]


def _check(family: str, case: Case, outputs: dict, data: CaseData):
    fam = get_family(family)
    return compare_outputs(outputs, data.oracle, data.lowprec, lambda n: fam.tolerance_for(case, n))


@pytest.mark.parametrize("family, params", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_lowprec_reference_passes_the_rule(family, params):
    case = Case(family, params, 4)
    data = CaseData(get_family(family), case, "cpu")
    ok, metrics = _check(family, case, data.lowprec, data)
    print(case, {k: m.summary() for k, m in metrics.items()})
    assert ok
    assert any(m.max_abs > 0 for m in metrics.values()), "lowprec equal to the oracle: the bound is only a floor"


def test_rope_in_the_wrong_direction_fails():
    fam = get_family("rope")
    case = Case("rope", {"op": "rope", "t": 20, "h": 2, "n": 512, "table": "yarn", "pos": "decode", "dtype": "bf16"}, 1)
    data = CaseData(fam, case, "cpu")
    wrong = fam.lowprec(Case("rope", {**case.params, "op": "inverse"}, 1), data.inputs)
    assert not _check("rope", case, wrong, data)[0]


def test_mhc_transposed_comb_fails():
    fam = get_family("mhc")
    case = Case("mhc", {"op": "post", "t": 7, "d": 512, "dtype": "bf16"}, 2)
    data = CaseData(fam, case, "cpu")
    wrong = fam.lowprec(case, {**data.inputs, "comb": data.inputs["comb"].transpose(-1, -2)})
    assert not _check("mhc", case, wrong, data)[0]


def test_mhc_pre_with_unnormalised_weights_fails():
    fam = get_family("mhc")
    case = Case("mhc", {"op": "pre", "t": 5, "d": 256, "dtype": "bf16"}, 3)
    data = CaseData(fam, case, "cpu")
    wrong = dict(data.lowprec, comb=data.lowprec["comb"] * 1.001)  # a Sinkhorn that stopped early
    assert not _check("mhc", case, wrong, data)[0]


def test_compressor_outputs_sit_on_the_fp8_grid_and_a_missing_qdq_is_caught():
    fam = get_family("compressor")
    case = Case("compressor", {"m": 4, "b": 1, "s": 64, "d": 512, "dtype": "bf16"}, 5)
    data = CaseData(fam, case, "cpu")
    assert off_grid(data.oracle["nope"]) == 0 and off_grid(data.lowprec["nope"]) == 0
    rope_only = fam.lowprec(case, data.inputs)["nope"]
    unquantised = rope_only + torch.rand_like(rope_only.float()).to(rope_only.dtype) * 1e-2
    assert off_grid(unquantised) > unquantised.numel() // 2


def test_sweep_spaces_hold_production_and_ragged_shapes():
    for family, want in (("rope", {(4096, 128, 512), (1, 1, 512), (1001, 64, 512)}),
                         ("mhc", {(4096, 7168), (1, 7168), (1001, 4096)}),
                         ("compressor", {(16384, 4), (16384, 128), (1001, 4)})):
        cases = get_family(family).cases(SweepOptions(examples=5, seed=0))
        keys = {(c["t"], c["h"], c["n"]) if family == "rope" else (c["t"], c["d"]) if family == "mhc"
                else (c["s"], c["m"]) for c in cases}
        assert want <= keys, (family, want - keys)
        assert sum(c.origin == "hypothesis" for c in cases) >= 3
