"""Declared variants of the mHC kernels (kernels/mhc/): run through the harness beside the shipped
kernels on the same inputs:

    dsv4bench sweep mhc --op pre,head --impl cutedsl,cutedsl:no-pdl --bench

Ablation that computes the real answer (`checked = True`, it must pass the oracle; hc_pre / hc_head):
    cutedsl:no-pdl   pass 2 (HcApplyKernel) launched plainly after pass 1 instead of as a
                     programmatic dependent launch (the seam: MhcCuteDSL.pdl)

Dropped with benchmarks/mhc_dispatch_probe.py: its `pdl_again` row (the shipped kernel timed a
second time in the same process: `cutedsl` itself).

Imported at the end of kernels/mhc/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.mhc.family import MhcCuteDSL


class MhcNoPdl(MhcCuteDSL):
    name, variant, checked = "cutedsl:no-pdl", "no-pdl", True
    pdl = False

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["op"] in ("post", "embed"):
            return "cutedsl:no-pdl changes hc_pre / hc_head's second launch (hc_post and embed are one kernel)"
        return super().supports(case, arch)


VARIANTS = (MhcNoPdl(),)
for _impl in VARIANTS:
    register_impl(_impl)
