"""Declared variants of the bf16 GEMM (op `bf16`): its tile rule (kernels/gemm/bf16_config.py) with one
knob overridden, each `cutedsl:<name>`, run only when named and timed beside the shipped rule and
torch on the same inputs, to check the rule on the H100:

    dsv4bench sweep gemm --op bf16 --examples 0 --bench \\
        --impl cutedsl,torch,cutedsl:bf16-bn128,cutedsl:bf16-bn64,cutedsl:bf16-no-split,cutedsl:bf16-k8

    bf16-bmB / bf16-bnB   CTA tile rows B (64, 128) / columns B (64, 128, 256) instead of the rule's
    bf16-no-split         split-K off; bf16-kS: S slices (2, 4, 8, 16)
    bf16-sS               S smem ring stages instead of as many as fit (2, 4, 8)
    bf16-gG               rasterisation groups of G M-tiles (1, 16; shipped 8)
    bf16-unrollU          the K-block loops unrolled U = 2, 4 times (shipped 1; the FP8 kernel ships 4)

Every one computes the real answer (it must pass the oracle); an override that makes an impossible
configuration is UNSUPPORTED there, as are the FP8 cases (the FP8 kernel's variants: variants.py).
Imported at the end of kernels/gemm/family.py; registers its impls itself.
"""

from __future__ import annotations

from dataclasses import replace

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.gemm.bf16_config import Bf16Config, choose_bf16_config
from kernels.gemm.family import GemmCuteDSL, is_bf16

KNOBS: dict[str, dict] = {
    **{f"bf16-bm{b}": {"bm": b} for b in (64, 128)},
    **{f"bf16-bn{b}": {"bn": b} for b in (64, 128, 256)},
    "bf16-no-split": {"split_k": 1},
    **{f"bf16-k{s}": {"split_k": s} for s in (2, 4, 8, 16)},
    **{f"bf16-s{s}": {"stages": s} for s in (2, 4, 8)},
    **{f"bf16-g{g}": {"group_m": g} for g in (1, 16)},
    **{f"bf16-unroll{u}": {"unroll": u} for u in (2, 4)},
}


class Bf16Knob(GemmCuteDSL):
    """The bf16 kernel with the rule's configuration overridden by `knobs`."""

    def __init__(self, name: str, knobs: dict):
        self.variant, self.name, self.knobs = name, f"cutedsl:{name}", dict(knobs)

    def config(self, case: Case) -> Bf16Config:
        if not is_bf16(case):
            raise ValueError("a bf16 tile variant (the FP8 kernel's are cutedsl:bm128, ...)")
        return replace(choose_bf16_config(case["m"], case["n"], case["k"]), **self.knobs)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            self.config(case)
        except ValueError as e:
            return f"{self.name}: {e}"
        return super().supports(case, arch)


VARIANTS = tuple(Bf16Knob(name, knobs) for name, knobs in KNOBS.items())
for _impl in VARIANTS:
    register_impl(_impl)
