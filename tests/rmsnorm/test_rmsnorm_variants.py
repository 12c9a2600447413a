"""RMSNorm's declared variants (kernels/rmsnorm/variants.py: the tuning knob sets) compile for sm_90a
from fake tensors at a width that fits them, with no spills (tests/rmsnorm/variant_checks.py). They
compute the real answer (checked); test_rmsnorm_tuning.py checks their hints in the PTX and, on a GPU,
their outputs."""

from __future__ import annotations

import pytest

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from kernels.rmsnorm.variants import knob_sets
from tests.rmsnorm.variant_checks import VariantBuild, declared

CASES = [{"m": 16384, "n": 7168, "dtype": "bf16", "weight": True}, {"m": 65536, "n": 512, "dtype": "bf16", "weight": True}]


@pytest.fixture(scope="module")
def build():
    return VariantBuild("rmsnorm", CASES)


def test_every_knob_set_is_a_checked_variant():
    assert {v.name: v.knobs for v in declared("rmsnorm")} == {f"cutedsl:{k}": v for k, v in knob_sets().items()}
    assert all(v.checked for v in declared("rmsnorm"))


@pytest.mark.parametrize("name", [v.name for v in declared("rmsnorm")])
def test_variant_compiles(build, name):
    build.check(name)
    for (i, n), fn in build.compiled.items():
        if n == name:
            info = parse_cubin(artifact(fn))
            assert info.registers is not None and info.registers <= 255 and info.local_bytes == 0, (name, CASES[i])
