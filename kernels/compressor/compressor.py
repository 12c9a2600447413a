"""Token-compressor pooling and entry post-processing in CuTeDSL (spec §5.3-§5.5), main compressor.

    c[b, s, ch] = Σ_candidates softmax(score)[ch] · kv[ch]          per channel
        HCA (m = 128): the m tokens of block s;  CSA (m = 4): the a-halves (channels [0, d)) of block
        s−1 and the b-halves (channels [d, 2d)) of block s, 8 candidates (block −1 absent)
    out[b, s] = qdq_fp8_NoPE( RoPE_{s·m}( RMSNorm_w(c) ) )          (fp32 math, one cast to bf16)

Memory-bound: the fp32 projections kv / score are read once (16-byte vectors), the entry written
once. A CTA owns one entry; a thread owns 4 channels. The softmax is online (running max, sum and
weighted sum per channel); for HCA, G = 4 thread groups split the 128 tokens and merge through
shared memory. Then group 0 normalises (warp butterfly + shared memory), rotates its last 64
channels with the position's table row and quantises the 448 NoPE channels in 64-wide blocks
(16 lanes each). One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
from cutlass import Float32

from kernels.compressor.fp8 import qdq_block
from kernels.rope.rotate import ROPE_DIM, rotate_pairs

VEC = 4  # fp32 channels per thread (16 bytes)
HCA_GROUPS = 4
QDQ_BLOCK = 64


class CompressorKernel:
    """Compile-time: ratio m, entry width d, eps. Batch and tokens are runtime sizes."""

    def __init__(self, m: int, d: int, eps: float = 1e-6):
        if d % 128 or d < 128:
            raise ValueError(f"compressor entry width must be a multiple of 128, got {d}")
        self.m, self.d, self.eps = m, d, eps
        self.overlap = m == 4
        self.groups = 1 if self.overlap else HCA_GROUPS
        if m % self.groups:
            raise ValueError(f"ratio {m} must be a multiple of {self.groups}")
        self.lanes = d // VEC  # threads per group
        self.warps = self.lanes // 32

    @cute.jit
    def __call__(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor,
                 mOut: cute.Tensor, stream):
        self.kernel(mKv, mScore, mW, mTab, mOut).launch(
            grid=[mOut.shape[1], mOut.shape[0], 1], block=[self.lanes * self.groups, 1, 1], stream=stream,
        )

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

    @cute.kernel
    def kernel(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor):
        m, d = self.m, self.d
        tidx, _, _ = cute.arch.thread_idx()
        s, b, _ = cute.arch.block_idx()
        group, lane = tidx // self.lanes, tidx % self.lanes
        gKv = cute.zipped_divide(mKv, (1, 1, VEC))  # ((1,1,4), (B, S, W/4))
        gSc = cute.zipped_divide(mScore, (1, 1, VEC))

        mx = cute.make_rmem_tensor((VEC,), Float32)
        l = cute.make_rmem_tensor((VEC,), Float32)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        mx.fill(-Float32.inf)
        l.fill(0.0)
        acc.fill(0.0)
        kv = cute.make_rmem_tensor((VEC,), Float32)
        z = cute.make_rmem_tensor((VEC,), Float32)
        if cutlass.const_expr(self.overlap):
            if s > 0:  # block s-1 feeds its first halves
                for j in cutlass.range_constexpr(m):
                    cute.autovec_copy(gKv[(0, 0, None), (b, (s - 1) * m + j, lane)], kv)
                    cute.autovec_copy(gSc[(0, 0, None), (b, (s - 1) * m + j, lane)], z)
                    self.absorb(kv, z, mx, l, acc)
            for j in cutlass.range_constexpr(m):  # block s feeds its second halves
                cute.autovec_copy(gKv[(0, 0, None), (b, s * m + j, self.lanes + lane)], kv)
                cute.autovec_copy(gSc[(0, 0, None), (b, s * m + j, self.lanes + lane)], z)
                self.absorb(kv, z, mx, l, acc)
        else:
            per_group = m // self.groups
            for j in cutlass.range(per_group, unroll=4):
                token = s * m + group * per_group + j
                cute.autovec_copy(gKv[(0, 0, None), (b, token, lane)], kv)
                cute.autovec_copy(gSc[(0, 0, None), (b, token, lane)], z)
                self.absorb(kv, z, mx, l, acc)

        smem = memory.SmemAllocator()
        s_sq = smem.allocate_tensor(Float32, cute.make_layout((self.warps,)), 16)
        y = cute.make_rmem_tensor((VEC,), Float32)
        if cutlass.const_expr(self.groups > 1):  # merge the groups' (max, sum, weighted sum)
            s_part = smem.allocate_tensor(Float32, cute.make_layout((3, self.groups, d)), 16)
            for i in cutlass.range_constexpr(VEC):
                s_part[0, group, lane * VEC + i] = mx[i]
                s_part[1, group, lane * VEC + i] = l[i]
                s_part[2, group, lane * VEC + i] = acc[i]
            cute.arch.barrier()
            for i in cutlass.range_constexpr(VEC):
                top = s_part[0, 0, lane * VEC + i]
                for g in cutlass.range_constexpr(1, self.groups):
                    top = cute.arch.fmax(top, s_part[0, g, lane * VEC + i])
                total = Float32(0.0)
                weighted = Float32(0.0)
                for g in cutlass.range_constexpr(self.groups):
                    w = cute.math.exp(s_part[0, g, lane * VEC + i] - top)
                    total += s_part[1, g, lane * VEC + i] * w
                    weighted += s_part[2, g, lane * VEC + i] * w
                y[i] = weighted / total
        else:
            for i in cutlass.range_constexpr(VEC):
                y[i] = acc[i] / l[i]

        # RMSNorm over the d channels (every group computes the same values; group 0 writes)
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
            cute.autovec_copy(cute.zipped_divide(mTab, (1, VEC))[(0, None), (s * m, (col - rope_start) // VEC)],
                              cos_sin)
            rotate_pairs(y, cos_sin, VEC, False)
        quant = cute.make_rmem_tensor((VEC,), Float32)
        quant.store(y.load())
        qdq_block(quant, VEC)  # every lane joins the butterfly; the rope lanes keep y
        if col < rope_start:
            y.store(quant.load())
        if group == 0:
            out = cute.make_rmem_tensor((VEC,), mOut.element_type)
            out.store(y.load().to(mOut.element_type))
            cute.autovec_copy(out, cute.zipped_divide(mOut, (1, 1, VEC))[(0, 0, None), (b, s, lane)])
