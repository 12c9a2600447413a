"""The mHC family's declared variant (kernels/mhc/variants.py) compiles for sm_90a from fake tensors
(tests/rmsnorm/variant_checks.py). cutedsl:no-pdl changes the launch, not the kernels: its SASS is the
shipped kernels', and its host code differs in the launch attribute only."""

from __future__ import annotations

import difflib
import re

import pytest

from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [{"op": "head", "t": 64, "d": 4096, "dtype": "bf16"}, {"op": "post", "t": 64, "d": 4096, "dtype": "bf16"}]


@pytest.fixture(scope="module")
def build():
    return VariantBuild("mhc", CASES)


def test_variants_are_declared():
    assert [(v.name, v.checked) for v in declared("mhc")] == [("cutedsl:no-pdl", True)]


@pytest.mark.parametrize("name", [v.name for v in declared("mhc")])
def test_variant_compiles(build, name):
    build.check(name)


def test_no_pdl_changes_the_launch_only(build):
    assert build.variants[0].supports(build.cases[1], "sm_90a")  # hc_post is one kernel: nothing to change
    assert build.sass[0, "cutedsl:no-pdl"] == build.sass[0, "cutedsl"]

    def host(fn):  # the host IR, without object addresses
        return [re.sub(r"object_at_\w*|0x[0-9a-f]+", "", line) for line in str(fn.ir_module).splitlines()]

    diff = [line for line in difflib.unified_diff(host(build.compiled[0, "cutedsl"]),
                                                  host(build.compiled[0, "cutedsl:no-pdl"]), lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(diff) == 2 and all("llvm.store" in line for line in diff), diff  # the PDL attribute's value
