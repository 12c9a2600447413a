"""Token-compressor pooling and entry post-processing in CuTeDSL (spec §5.3-§5.5), main compressor.

    c[b, s, ch] = Σ_candidates softmax(score)[ch] · kv[ch]          per channel
        HCA (m = 128): the m tokens of block s;  CSA (m = 4): the a-halves (channels [0, d)) of block
        s−1 and the b-halves (channels [d, 2d)) of block s, 8 candidates (block −1 absent)
    out[b, s] = qdq_fp8_NoPE( RoPE_{s·m}( RMSNorm_w(c) ) )          (fp32 math, one cast to bf16)

Memory-bound: the fp32 projections kv / score are read once (16-byte vectors), the entry written
once; a thread owns 4 channels and keeps an online softmax state (running max, sum and weighted
sum) per channel. This module holds the shared pieces (`EntryKernel`: the online update and the
post-processing) and the CSA kernel (a CTA per entry); `hca.py` holds the HCA kernel (several CTAs
per entry). The post-processing normalises (warp butterfly + shared memory), rotates the last 64
channels with the position's table row and quantises the 448 NoPE channels in 64-wide blocks (16
lanes each). One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
from cutlass import Float32

from kernels.compressor.fp8 import qdq_block
from kernels.rope.rotate import ROPE_DIM, rotate_pairs

VEC = 4  # fp32 channels per thread (16 bytes)


class EntryKernel:
    """Compile-time: ratio m, entry width d, eps; `groups` thread groups of d/4 lanes per CTA."""

    def __init__(self, m: int, d: int, eps: float = 1e-6, groups: int = 1):
        if d % 128 or d < 128:
            raise ValueError(f"compressor entry width must be a multiple of 128, got {d}")
        self.m, self.d, self.eps, self.groups = m, d, eps, groups
        self.lanes = d // VEC  # threads per group
        self.warps = self.lanes // 32

    @cute.jit
    def absorb(self, kv, z, mx, l, acc):
        """Online softmax update of 4 channels with one candidate (kv, z)."""
        for i in cutlass.range_constexpr(VEC):
            new = cute.arch.fmax(mx[i], z[i])
            corr = cute.math.exp(mx[i] - new)
            p = cute.math.exp(z[i] - new)
            l[i] = l[i] * corr + p
            acc[i] = acc[i] * corr + p * kv[i]
            mx[i] = new

    @cute.jit
    def combine(self, mx, l, acc, mx2, l2, acc2):
        """Fold a second (non-empty) softmax state of the same 4 channels into (mx, l, acc)."""
        for i in cutlass.range_constexpr(VEC):
            new = cute.arch.fmax(mx[i], mx2[i])
            a = cute.math.exp(mx[i] - new)
            c = cute.math.exp(mx2[i] - new)
            l[i] = l[i] * a + l2[i] * c
            acc[i] = acc[i] * a + acc2[i] * c
            mx[i] = new

    @cute.jit
    def finish(self, smem, y, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor, b, s, group, lane):
        """RMSNorm, RoPE at s·m and FP8 NoPE qdq of the pooled entry y (4 channels per lane), then the
        bf16 store by group 0. Every thread of the CTA calls it (barriers, warp butterflies); `smem`
        is the kernel's one shared-memory allocator."""
        self.norm_rope(smem, y, mW, mTab, s * self.m, group, lane)
        self.quantise(y, lane)
        if group == 0:
            out = cute.make_rmem_tensor((VEC,), mOut.element_type)
            out.store(y.load().to(mOut.element_type))
            cute.autovec_copy(out, cute.zipped_divide(mOut, (1, 1, VEC))[(0, 0, None), (b, s, lane)])

    @cute.jit
    def norm_rope(self, smem, y, mW: cute.Tensor, mTab: cute.Tensor, row, group, lane):
        """RMSNorm of the entry y (weight mW), then RoPE of its last 64 channels with row `row` of the
        (cos, sin) table. Every thread of the CTA calls it (a barrier)."""
        d = self.d
        s_sq = smem.allocate_tensor(Float32, cute.make_layout((self.warps,)), 16)
        sum_sq = Float32(0.0)
        for i in cutlass.range_constexpr(VEC):
            sum_sq += y[i] * y[i]
        sum_sq = cute.arch.warp_reduction_sum(sum_sq)
        if group == 0 and lane % 32 == 0:
            s_sq[lane // 32] = sum_sq
        cute.arch.barrier()
        sum_sq = Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            sum_sq += s_sq[w]
        rstd = cute.math.rsqrt(sum_sq / d + self.eps)
        w_raw = cute.make_rmem_tensor((VEC,), mW.element_type)
        cute.autovec_copy(cute.zipped_divide(mW, (VEC,))[(None,), (lane,)], w_raw)
        w_f = w_raw.load().to(Float32)
        for i in cutlass.range_constexpr(VEC):
            y[i] = y[i] * rstd * w_f[i]

        col = lane * VEC
        rope_start = d - ROPE_DIM
        if col >= rope_start:
            cos_sin = cute.make_rmem_tensor((VEC,), Float32)
            cute.autovec_copy(cute.zipped_divide(mTab, (1, VEC))[(0, None), (row, (col - rope_start) // VEC)],
                              cos_sin)
            rotate_pairs(y, cos_sin, VEC, False)

    @cute.jit
    def quantise(self, y, lane):
        """The main compressor's QAT: FP8 qdq of the NoPE channels in 64-wide blocks (16 lanes each)."""
        col = lane * VEC
        quant = cute.make_rmem_tensor((VEC,), Float32)
        quant.store(y.load())
        qdq_block(quant, VEC)  # every lane joins the butterfly; the rope lanes keep y
        if col < self.d - ROPE_DIM:
            y.store(quant.load())


class CsaKernel(EntryKernel):
    """CSA (m = 4): a CTA of d/4 threads per entry. Every thread issues the loads of its 8 candidates
    (block s−1 clamped to block 0 at s = 0) before any is consumed: one DRAM round trip per CTA. The
    a-halves of block −1 are masked with a score of −inf, folded in after the b-halves (whose max is
    finite) so that they add exactly zero."""

    def __init__(self, m: int, d: int, eps: float = 1e-6):
        if m != 4:
            raise ValueError(f"the CSA kernel is for m = 4, got {m}")
        super().__init__(m, d, eps)

    @cute.jit
    def __call__(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor,
                 mOut: cute.Tensor, stream):
        self.kernel(mKv, mScore, mW, mTab, mOut).launch(
            grid=[mOut.shape[1], mOut.shape[0], 1], block=[self.lanes, 1, 1], stream=stream,
        )

    @cute.jit
    def pool(self, mKv: cute.Tensor, mScore: cute.Tensor, s, b, lane, y):
        m = self.m
        gKv = cute.zipped_divide(mKv, (1, 1, VEC))  # ((1,1,4), (B, S, W/4))
        gSc = cute.zipped_divide(mScore, (1, 1, VEC))
        kv = cute.make_rmem_tensor(cute.make_layout((VEC, 2 * m), stride=(1, VEC)), Float32)
        z = cute.make_rmem_tensor(cute.make_layout((VEC, 2 * m), stride=(1, VEC)), Float32)
        prev = cutlass.max(s - 1, 0)
        for j in cutlass.range_constexpr(m):
            cute.autovec_copy(gKv[(0, 0, None), (b, s * m + j, self.lanes + lane)], kv[None, j])
            cute.autovec_copy(gSc[(0, 0, None), (b, s * m + j, self.lanes + lane)], z[None, j])
            cute.autovec_copy(gKv[(0, 0, None), (b, prev * m + j, lane)], kv[None, m + j])
            cute.autovec_copy(gSc[(0, 0, None), (b, prev * m + j, lane)], z[None, m + j])
        mask = Float32(0.0)
        if s == 0:
            mask = -Float32.inf
        mx = cute.make_rmem_tensor((VEC,), Float32)
        l = cute.make_rmem_tensor((VEC,), Float32)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        mx.fill(-Float32.inf)
        l.fill(0.0)
        acc.fill(0.0)
        for j in cutlass.range_constexpr(2 * m):
            zj = z[None, j]
            if cutlass.const_expr(j >= m):
                for i in cutlass.range_constexpr(VEC):
                    zj[i] = zj[i] + mask
            self.absorb(kv[None, j], zj, mx, l, acc)
        for i in cutlass.range_constexpr(VEC):
            y[i] = acc[i] / l[i]

    @cute.kernel
    def kernel(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        s, b, _ = cute.arch.block_idx()
        y = cute.make_rmem_tensor((VEC,), Float32)
        self.pool(mKv, mScore, s, b, tidx, y)
        self.finish(memory.SmemAllocator(), y, mW, mTab, mOut, b, s, 0, tidx)
