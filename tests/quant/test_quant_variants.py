"""The quant family's declared variants (kernels/quant/variants.py) compile for sm_90a from fake
tensors, and each knock-out's SASS differs from the shipped rotate kernel's (tests/rmsnorm/variant_checks.py)."""

from __future__ import annotations

import pytest

from sweeps import quant as space
from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [space.mxfp4(4096), space.fp8(64, 7168)]  # the rotate path, and a case none of them takes


@pytest.fixture(scope="module")
def build():
    return VariantBuild("quant", CASES)


def test_variants_are_declared():
    assert {v.name for v in declared("quant")} == {
        "cutedsl:no-e2m1", "cutedsl:no-hadamard", "cutedsl:pattern-only", "cutedsl:copy-pattern", "cutedsl:empty-grid"}
    assert not any(v.checked for v in declared("quant"))


@pytest.mark.parametrize("name", [v.name for v in declared("quant")])
def test_variant_compiles_and_knocks_out(build, name):
    build.check(name)
    assert (1, name) not in build.compiled  # the rotate path only: the fp8 case is UNSUPPORTED
