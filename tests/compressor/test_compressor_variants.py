"""The compressor's declared variants (kernels/compressor/variants.py) compile for sm_90a from fake
tensors, for CSA and HCA, and each knock-out's SASS differs from the shipped kernel's
(tests/rmsnorm/variant_checks.py); the HCA split ablations are HCA-only."""

from __future__ import annotations

import pytest

from tests.rmsnorm.variant_checks import VariantBuild, declared

CSA = {"m": 4, "b": 1, "s": 16384, "d": 512, "dtype": "bf16"}
HCA = {"m": 128, "b": 1, "s": 16384, "d": 512, "dtype": "bf16"}
SPLITS = {"cutedsl:hca-p1g4", "cutedsl:hca-p4g1", "cutedsl:hca-p4g2", "cutedsl:hca-p16g1"}


@pytest.fixture(scope="module")
def build():
    return VariantBuild("compressor", [CSA, HCA], every_case=True)  # CSA and HCA: two kernels


def test_variants_are_declared():
    assert {v.name for v in declared("compressor") if v.checked} == SPLITS
    assert {v.name for v in declared("compressor") if not v.checked} == {
        "cutedsl:no-post", "cutedsl:loads-only", "cutedsl:empty-grid"}


@pytest.mark.parametrize("name", [v.name for v in declared("compressor")])
def test_variant_compiles_and_knocks_out(build, name):
    build.check(name)
    assert ((0, name) in build.compiled) == (name not in SPLITS)  # a split ablation is HCA's alone
    assert (1, name) in build.compiled
