"""What every family's variants test (tests/<family>/test_<family>_variants.py) checks on a CPU, in one
place: each declared variant (kernels/<family>/variants.py) is registered as `cutedsl:<variant>`,
compiles for sm_90a from fake tensors, and a knock-out (`checked = False`) generates SASS that differs
from the shipped kernel's for the same case (a knock-out that knocks out nothing is a defect).

A family's test builds one `VariantBuild` in a module-scoped fixture: each variant is compiled once,
for the first of the test's cases it supports (`every_case`: for each one, where a variant is a
different kernel per case), beside the shipped kernel of that case; nvdisasm runs once per compile.
"""

from __future__ import annotations

import re

import pytest

from dsv4bench.compile.sass import find_nvdisasm, sass_of
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl, impls

ARCH = "sm_90a"
SHIPPED = "cutedsl"


def declared(family: str) -> list:
    """The family's declared variants (registry order)."""
    return [i for i in impls(family, variants=True) if i.variant]


def instructions(sass: str) -> str:
    """The instruction stream of a SASS listing, without addresses, symbols or section names (a
    subclass's kernel has another symbol name, not other code)."""
    return "\n".join(m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass))


class VariantBuild:
    """The shipped kernel and every declared variant of `family`, compiled for each case they support."""

    def __init__(self, family: str, cases: list[dict], every_case: bool = False):
        if find_nvdisasm() is None:
            pytest.skip("needs nvdisasm (the nvidia-cuda-nvdisasm wheel) to read SASS")
        self.family = family
        self.cases = [Case(family, p, 0) for p in cases]
        self.variants = declared(family)
        self.compiled: dict[tuple[int, str], object] = {}  # (case index, impl name) -> compiled function
        self.sass: dict[tuple[int, str], str] = {}
        for impl in self.variants:
            for i, case in enumerate(self.cases):
                if impl.supports(case, ARCH) is None:
                    self._compile(i, get_impl(family, SHIPPED))
                    self._compile(i, impl)
                    if not every_case:
                        break

    def _compile(self, i: int, impl) -> None:
        if (i, impl.name) not in self.compiled:
            self.compiled[i, impl.name] = fn = impl.compile(self.cases[i], ARCH)
            self.sass[i, impl.name] = instructions(sass_of(fn) or "")

    def check(self, name: str) -> None:
        impl = get_impl(self.family, name)
        assert impl.name == f"{SHIPPED}:{impl.variant}" and impl.backend == "cutedsl" and impl.compiles
        built = [i for i, n in self.compiled if n == name]
        assert built, f"{name} supports none of the test's cases: {[c.params for c in self.cases]}"
        for i in built:
            assert self.sass[i, name], f"{name}: no SASS for case {self.cases[i].params}"
            if not impl.checked:
                assert self.sass[i, name] != self.sass[i, SHIPPED], (
                    f"knock-out {name} generates the shipped kernel's SASS for {self.cases[i].params}")
