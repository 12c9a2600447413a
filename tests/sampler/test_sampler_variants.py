"""The sampler's declared variants (kernels/sampler/variants.py) compile for sm_90a from fake
tensors, and each knock-out's SASS differs from the shipped kernel's (tests/rmsnorm/variant_checks.py)."""

from __future__ import annotations

import pytest

from sweeps import sampler as space
from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [space.case(1, 0.6)]  # one compile serves every B and temperature (both are run-time)


@pytest.fixture(scope="module")
def build():
    return VariantBuild("sampler", CASES)


def test_variants_are_declared():
    assert {v.name for v in declared("sampler")} == {
        "cutedsl:no-merge", "cutedsl:no-rank", "cutedsl:loads-only", "cutedsl:empty-grid"}
    assert not any(v.checked for v in declared("sampler"))


def test_empty_grid_has_the_shipped_launch_shape():
    from dsv4bench.core.case import Case
    from dsv4bench.core.registry import get_impl
    from kernels.sampler.sampler import THREADS, SamplerKernel, plan

    empty = get_impl("sampler", "cutedsl:empty-grid")
    for b in (1, 64, 256):
        case = Case("sampler", space.case(b, 0.6), 0)
        assert empty.launch_shape(case) == ((plan(b, SamplerKernel(space.VOCAB).tiles)[1], b, 1), THREADS)


@pytest.mark.parametrize("name", [v.name for v in declared("sampler")])
def test_variant_compiles_and_knocks_out(build, name):
    build.check(name)
