"""The quant family's declared variants (kernels/quant/variants.py) compile for sm_90a from fake
tensors, and each knock-out's SASS differs from the shipped rotate kernel's (tests/rmsnorm/variant_checks.py)."""

from __future__ import annotations

import pytest

from dsv4bench.core.case import Case
from sweeps import quant as space
from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [space.mxfp4(4096)]  # the rotate path (Hadamard-128 + MXFP4): the only one they take
OTHER = [space.fp8(64, 7168), space.mxfp4(4096, 256, rotate=False)]


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
    impl = build.variants[[v.name for v in build.variants].index(name)]
    assert all(impl.supports(Case("quant", p, 0), "sm_90a") for p in OTHER)  # UNSUPPORTED, with a reason
