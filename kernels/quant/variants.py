"""Declared variants of the quant kernel's rotate path (Hadamard-128 + MXFP4, kernels/quant/rotate.py):
where its time goes, run through the harness beside the shipped kernel on the same inputs:

    dsv4bench sweep quant --width 128 --impl cutedsl,cutedsl:no-e2m1,cutedsl:no-hadamard,\\
        cutedsl:pattern-only,cutedsl:copy-pattern,cutedsl:empty-grid --bench

Every variant here is a knock-out or a reference row (`checked = False`: run, timed, never compared):

    cutedsl:no-e2m1       the bf16 pair itself instead of its two e2m1 codes (seam `e2m1x2`)
    cutedsl:no-hadamard   no rotation: bf16 in, quantised as is (seam `hadamard`)
    cutedsl:pattern-only  both knocked out: v4's loads and stores with next to no math
    cutedsl:copy-pattern  the op's bytes with a copy's access pattern (512 contiguous bytes per warp
                          instruction), `CopyPattern` below
    cutedsl:empty-grid    an empty kernel of the same grid and block (the launch floor, kernels/probes.py)

They apply to the rotate path only (fmt mxfp4, n = 128, rotate); other cases are UNSUPPORTED.
Dropped with benchmarks/quant_probe.py: `v3_direct_loads` and `v3_pattern_only` (v3's direct
register loads, kept only for comparison; their figures are in docs/perf/quant.md, "MXFP4 + Hadamard
(rotate path)") and `torch_read_x` (a torch sum of the input; the harness times a same-size copy per case).

Imported at the end of kernels/quant/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.probes import EmptyGridMixin
from kernels.quant import rotate
from kernels.quant.family import QuantCuteDSL
from kernels.quant.quant import QuantKernel


class NoE2m1:
    """Knock-out of the e2m1 rounding: the packed bf16 pair is stored as its own 'codes'."""

    def e2m1x2(self, p, inv):
        return p


class NoHadamard:
    """Knock-out of the rotation: the butterfly is skipped."""

    @cute.jit
    def hadamard(self, x: cute.Tensor, lane: cutlass.Int32):
        pass


class CopyPattern:
    """The op's bytes with a copy's access pattern: CTA b reads rows 64b..64b+63 (16 KB, contiguous
    when the row stride is 128) with every warp instruction on 512 contiguous bytes, and writes their
    64 code bytes and 4 scale bytes per row the same way; the stored words depend on every load."""

    def __init__(self, *_):
        pass

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        self.kernel(mX, mQ, mS).launch(grid=[cute.ceil_div(mX.shape[0], 64), 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gX = cute.zipped_divide(mX, (1, 8))
        raw = cute.make_rmem_tensor((8, 8), mX.element_type)
        for j in cutlass.range_constexpr(8):
            e = 128 * j + tidx  # 16-byte vector e of the CTA's 64 rows
            src = cutlass.min(64 * bidx + e // 16, mX.shape[0] - 1)
            cute.autovec_copy(gX[(0, None), (src, e % 16)], raw[None, j])
        words = cute.recast_tensor(raw, cutlass.Int32)
        acc = words[0]
        for i in cutlass.range_constexpr(1, 32):
            acc = acc ^ words[i]
        out = cute.make_rmem_tensor((4,), cutlass.Int32)
        for i in cutlass.range_constexpr(4):
            out[i] = acc + i
        gQ = cute.zipped_divide(cute.recast_tensor(mQ, cutlass.Int32), (1, 4))
        for j in cutlass.range_constexpr(2):
            e = 128 * j + tidx  # 16-byte vector e of the CTA's 64 code rows
            if 64 * bidx + e // 4 < mX.shape[0]:
                cute.autovec_copy(out, gQ[(0, None), (64 * bidx + e // 4, e % 4)])
        for k in cutlass.range_constexpr(2):
            b = 2 * tidx + k  # scale byte b of the CTA's 64 rows
            if 64 * bidx + b // 4 < mX.shape[0]:
                mS[64 * bidx + b // 4, b % 4] = cutlass.Uint8(acc >> (8 * k))


class RotateVariant(QuantCuteDSL):
    """A variant of the rotate path: `kernel_class` is compiled in place of QuantKernel."""

    checked = False
    kernel_class: type = QuantKernel

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if not (case["fmt"] == "mxfp4" and case["rotate"] and case["n"] == rotate.HADAMARD_N):
            return f"cutedsl:{self.variant} probes the Hadamard + MXFP4 path only (mxfp4, n = 128, rotate)"
        return super().supports(case, arch)

    def make_kernel(self, case: Case):
        return self.kernel_class(case["fmt"], case["n"], case["block"], bool(case["rotate"]))


class QuantNoE2m1(RotateVariant):
    name, variant = "cutedsl:no-e2m1", "no-e2m1"
    kernel_class = type("QuantNoE2m1Kernel", (NoE2m1, QuantKernel), {})


class QuantNoHadamard(RotateVariant):
    name, variant = "cutedsl:no-hadamard", "no-hadamard"
    kernel_class = type("QuantNoHadamardKernel", (NoHadamard, QuantKernel), {})


class QuantPatternOnly(RotateVariant):
    name, variant = "cutedsl:pattern-only", "pattern-only"
    kernel_class = type("QuantPatternOnlyKernel", (NoE2m1, NoHadamard, QuantKernel), {})


class QuantCopyPattern(RotateVariant):
    name, variant = "cutedsl:copy-pattern", "copy-pattern"
    kernel_class = CopyPattern


class QuantEmptyGrid(EmptyGridMixin, RotateVariant):
    name, variant = "cutedsl:empty-grid", "empty-grid"

    def launch_shape(self, case: Case):
        return (-(-case["m"] // rotate.ROWS_PER_CTA), 1, 1), rotate.THREADS


VARIANTS = (QuantNoE2m1(), QuantNoHadamard(), QuantPatternOnly(), QuantCopyPattern(), QuantEmptyGrid())
for _impl in VARIANTS:
    register_impl(_impl)
