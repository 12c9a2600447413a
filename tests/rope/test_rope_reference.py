"""RoPE on the CPU: the low-precision reference passes the tolerance rule against the FP32 oracle
with a non-zero error (the bound is not only a floor), wrong answers fail it, and the sweep space holds
the production and ragged shapes."""

from __future__ import annotations

import pytest

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, get_family
from tests.reference import check_reference

CASES = [
    {"op": "q_norm_rope", "t": 37, "h": 3, "n": 512, "table": "yarn", "pos": "decode", "dtype": "bf16"},
    {"op": "inverse", "t": 5, "h": 64, "n": 512, "table": "swa", "pos": "prefill", "dtype": "bf16"},
    {"op": "rope", "t": 9, "h": 64, "n": 128, "table": "yarn", "pos": "decode", "dtype": "fp16"},
]


@pytest.mark.parametrize("params", CASES, ids=str)
def test_lowprec_reference_passes_the_rule(params):
    ok, metrics, _ = check_reference(Case("rope", params, 4))
    print(params, {k: m.summary() for k, m in metrics.items()})
    assert ok
    assert any(m.max_abs > 0 for m in metrics.values()), "lowprec equal to the oracle: the bound is only a floor"


def test_rope_in_the_wrong_direction_fails():
    fam = get_family("rope")
    case = Case("rope", {"op": "rope", "t": 20, "h": 2, "n": 512, "table": "yarn", "pos": "decode", "dtype": "bf16"}, 1)
    data = CaseData(fam, case, "cpu")
    wrong = fam.lowprec(Case("rope", {**case.params, "op": "inverse"}, 1), data.inputs)
    assert not check_reference(case, wrong)[0]


def test_sweep_space_holds_production_and_ragged_shapes():
    cases = get_family("rope").cases(SweepOptions(examples=5, seed=0))
    assert {(4096, 128, 512), (1, 1, 512), (1001, 64, 512)} <= {(c["t"], c["h"], c["n"]) for c in cases}
    assert sum(c.origin == "hypothesis" for c in cases) >= 3
