"""Declared variants of the sampler kernel (kernels/sampler/sampler.py): where its time goes at small
B, run through the harness beside the shipped kernel on the same inputs:

    dsv4bench sweep sampler --rows 1,64 --impl cutedsl,cutedsl:no-merge,cutedsl:no-rank,\\
        cutedsl:loads-only,cutedsl:empty-grid --bench

Every variant here is a knock-out or a reference row (`checked = False`: run, timed, never compared):
    cutedsl:no-merge     each CTA stores its partial and ends: no acq_rel atomic, no last-CTA merge
                         (seam `merge`)
    cutedsl:no-rank      x − g replaced by logit + noise (no divide, no log) and no comparisons
                         (seam `rank`)
    cutedsl:loads-only   no-rank and no-merge: the loads, the block reduction, one store
    cutedsl:empty-grid   an empty kernel of the same grid and block (the launch floor, kernels/probes.py)

Imported at the end of kernels/sampler/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.probes import EmptyGridMixin
from kernels.sampler.family import SamplerCuteDSL
from kernels.sampler.sampler import DEPTH, THREADS, VEC, SamplerKernel, plan


class NoMerge(SamplerKernel):
    @cute.jit
    def merge(self, mPF, mPI, mCnt, mTok, row, split, splits, lane, x, g, i):
        if lane == 0:
            mPF[row, 0, split], mPF[row, 1, split], mPI[row, split] = x, g, i


class NoRank(SamplerKernel):
    @cute.jit
    def rank(self, logit, noise, tile, end, tidx, t_eff, best, sampled: cutlass.Constexpr):
        bx, bg, bi = best
        for k in cutlass.range_constexpr(DEPTH):
            for e in cutlass.range_constexpr(VEC):
                bx = bx + logit[k, e]
                if cutlass.const_expr(sampled):
                    bg = bg + noise[k, e]
        return bx, bg, bi + Int32(tile)


class LoadsOnly(NoRank, NoMerge):
    pass


class SamplerVariant(SamplerCuteDSL):
    """A knock-out: `kernel_class` (SamplerKernel with a part overridden) compiled in its place."""

    checked = False
    kernel_class: type = SamplerKernel

    def make_kernel(self, case: Case):
        return self.kernel_class(case["v"])


class SamplerNoMerge(SamplerVariant):
    name, variant, kernel_class = "cutedsl:no-merge", "no-merge", NoMerge


class SamplerNoRank(SamplerVariant):
    name, variant, kernel_class = "cutedsl:no-rank", "no-rank", NoRank


class SamplerLoadsOnly(SamplerVariant):
    name, variant, kernel_class = "cutedsl:loads-only", "loads-only", LoadsOnly


class SamplerEmptyGrid(EmptyGridMixin, SamplerVariant):
    name, variant = "cutedsl:empty-grid", "empty-grid"

    def launch_shape(self, case: Case):
        _, splits = plan(case["b"], SamplerKernel(case["v"]).tiles)
        return (splits, case["b"], 1), THREADS


VARIANTS = (SamplerNoMerge(), SamplerNoRank(), SamplerLoadsOnly(), SamplerEmptyGrid())
for _impl in VARIANTS:
    register_impl(_impl)
