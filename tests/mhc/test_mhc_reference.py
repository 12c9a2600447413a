"""mHC on the CPU: the low-precision reference passes the tolerance rule against the FP32 oracle
with a non-zero error (the bound is not only a floor), wrong answers fail it, and the sweep space holds
the production and ragged shapes."""

from __future__ import annotations

import pytest

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, get_family
from tests.reference import check_reference

CASES = [
    {"op": "pre", "t": 33, "d": 4096, "dtype": "bf16"},
    {"op": "post", "t": 3, "d": 7168, "dtype": "bf16"},
    {"op": "head", "t": 2, "d": 1000, "dtype": "bf16"},
]


@pytest.mark.parametrize("params", CASES, ids=str)
def test_lowprec_reference_passes_the_rule(params):
    ok, metrics, _ = check_reference(Case("mhc", params, 4))
    print(params, {k: m.summary() for k, m in metrics.items()})
    assert ok
    assert any(m.max_abs > 0 for m in metrics.values()), "lowprec equal to the oracle: the bound is only a floor"


def test_mhc_transposed_comb_fails():
    fam = get_family("mhc")
    case = Case("mhc", {"op": "post", "t": 7, "d": 512, "dtype": "bf16"}, 2)
    data = CaseData(fam, case, "cpu")
    wrong = fam.lowprec(case, {**data.inputs, "comb": data.inputs["comb"].transpose(-1, -2)})
    assert not check_reference(case, wrong)[0]


def test_mhc_pre_with_unnormalised_weights_fails():
    fam = get_family("mhc")
    case = Case("mhc", {"op": "pre", "t": 5, "d": 256, "dtype": "bf16"}, 3)
    data = CaseData(fam, case, "cpu")
    wrong = dict(data.lowprec, comb=data.lowprec["comb"] * 1.001)  # a Sinkhorn that stopped early
    assert not check_reference(case, wrong)[0]


def test_sweep_space_holds_production_and_ragged_shapes():
    cases = get_family("mhc").cases(SweepOptions(examples=5, seed=0))
    assert {(4096, 7168), (1, 7168), (1001, 4096)} <= {(c["t"], c["d"]) for c in cases}
    assert sum(c.origin == "hypothesis" for c in cases) >= 3
