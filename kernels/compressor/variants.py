"""Declared variants of the compressor kernels (CSA: kernels/compressor/compressor.py, HCA: hca.py):
each kernel with one part knocked out, or HCA with another split, run through the harness beside the
shipped kernel on the same inputs:

    dsv4bench sweep compressor --rows 16384 --impl cutedsl,cutedsl:no-post,cutedsl:loads-only,\\
        cutedsl:hca-p1g4,cutedsl:hca-p4g1,cutedsl:hca-p4g2,cutedsl:hca-p16g1,cutedsl:empty-grid --bench

Knock-outs (`checked = False`: run, timed, never compared), CSA (the indexer's too) and HCA:
    cutedsl:no-post      pooling only: RMSNorm, RoPE and the FP8 qdq knocked out, y stored as is
                         (seam `EntryKernel.finish`)
    cutedsl:loads-only   the loads and the stores; the online softmax replaced by adds (seam `absorb`)
    cutedsl:empty-grid   an empty kernel of the same grid and block (the launch floor, kernels/probes.py)
Ablations of HCA's split (`checked = True`, they must pass the oracle; HCA cases only):
    cutedsl:hca-pPgG     P CTAs per entry, G thread groups per CTA (shipped: p8g1; p1g4 is v1)

Imported at the end of kernels/compressor/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.compressor.compressor import VEC, CsaKernel
from kernels.compressor.family import CompressorCuteDSL, entries, indexed
from kernels.compressor.hca import SPLITS, HcaKernel
from kernels.compressor.indexer import IndexerCsaKernel
from kernels.probes import EmptyGridMixin
from oracles.compressor import overlaps
from oracles.norm import NORM_EPS


class NoPost:
    @cute.jit
    def finish(self, smem, y, mW, mTab, mOut, b, s, group, lane):
        if group == 0:
            out = cute.make_rmem_tensor((VEC,), mOut.element_type)
            out.store(y.load().to(mOut.element_type))
            cute.autovec_copy(out, cute.zipped_divide(mOut, (1, 1, VEC))[(0, 0, None), (b, s, lane)])


class LoadsOnly:
    @cute.jit
    def absorb(self, kv, z, mx, l, acc):
        for i in cutlass.range_constexpr(VEC):
            l[i] = l[i] + z[i]
            acc[i] = acc[i] + kv[i]
            mx[i] = z[i]


class KnockOut(CompressorCuteDSL):
    """`part` mixed into the shipped kernel of the case (CSA or HCA)."""

    checked = False
    part: type = object

    def make_kernel(self, case: Case):
        base = IndexerCsaKernel if indexed(case) else CsaKernel if overlaps(case["m"]) else HcaKernel
        cls = type(f"{self.part.__name__}{base.__name__}", (self.part, base), {})
        return cls(case["m"], case["d"], NORM_EPS)


class CompressorNoPost(KnockOut):
    name, variant, part = "cutedsl:no-post", "no-post", NoPost


class CompressorLoadsOnly(KnockOut):
    name, variant, part = "cutedsl:loads-only", "loads-only", LoadsOnly


class HcaSplit(CompressorCuteDSL):
    """HCA with `splits` CTAs per entry and `groups` thread groups per CTA."""

    def __init__(self, splits: int, groups: int):
        self.hca = {"splits": splits, "groups": groups}
        self.variant = f"hca-p{splits}g{groups}"
        self.name = f"cutedsl:{self.variant}"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if overlaps(case["m"]):
            return f"{self.name} is an HCA split (m = 128); CSA has one CTA per entry"
        try:
            self.make_kernel(case)
        except ValueError as e:
            return str(e)
        return super().supports(case, arch)


class CompressorEmptyGrid(EmptyGridMixin, CompressorCuteDSL):
    name, variant, checked = "cutedsl:empty-grid", "empty-grid", False

    def launch_shape(self, case: Case):
        threads = case["d"] // VEC  # one group of d/4 lanes (CSA, and HCA's shipped split)
        if overlaps(case["m"]):
            return (entries(case), case["b"], 1), threads
        return (SPLITS, entries(case), case["b"]), threads


VARIANTS = (CompressorNoPost(), CompressorLoadsOnly(), HcaSplit(1, 4), HcaSplit(4, 1), HcaSplit(4, 2), HcaSplit(16, 1),
            CompressorEmptyGrid())
for _impl in VARIANTS:
    register_impl(_impl)
