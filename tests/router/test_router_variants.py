"""The router's declared variants (kernels/router/variants.py) compile for sm_90a from fake tensors
with no local memory and at most 64 registers (one warp per token, 8 warps per CTA), and each
knock-out's SASS differs from the shipped v3 kernel's (tests/rmsnorm/variant_checks.py)."""

from __future__ import annotations

import pytest

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from sweeps import router as space
from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [space.case(1, 384, 2.5, False), space.case(1, 256, 1.5, True)]  # a score layer (Pro), a hash layer (Flash)
CHECKED = {"cutedsl:libsqrt", "cutedsl:bfly"}  # compute the real answer


@pytest.fixture(scope="module")
def build():
    return VariantBuild("router", CASES)


def test_variants_are_declared():
    assert {v.name for v in declared("router") if v.checked} == CHECKED
    assert {v.name for v in declared("router") if not v.checked} == {
        "cutedsl:no-fp64", "cutedsl:no-topk", "cutedsl:no-score", "cutedsl:loads-only", "cutedsl:empty-grid"}


@pytest.mark.parametrize("name", [v.name for v in declared("router")])
def test_variant_compiles_and_knocks_out(build, name):
    build.check(name)
    for (i, n), fn in build.compiled.items():
        if n == name:
            info = parse_cubin(artifact(fn))
            assert 0 < info.registers <= 64 and info.local_bytes == 0, (name, CASES[i])
