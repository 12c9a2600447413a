"""Partial interleaved RoPE in CuTeDSL, optionally fused with the per-head weightless RMSNorm of q
(spec §2.2, §4, §7.3). One source for sm_90a and sm_100a (plain 128-bit loads, warp shuffles).

    out[r] = RoPE_{pos[r // heads]}( norm ? x[r]·rsqrt(mean(x[r]²) + eps) : x[r] )   on the last 64 dims

x is viewed as rows [T·heads, n] (one row per token and head); positions [T] int32 index a table
of (cos, sin) rows (`rotate.rope_table`), so YaRN / non-YaRN is only a matter of which table.
`inverse` rotates by −θ (the attention output, §7.3).

Design (memory-bound: read x once, write out once, fp32 math in registers):
- One warp per row; lane l holds the 16-byte vectors l, l+32, ... of the row (coalesced).
- The norm's sum of squares is a warp butterfly; the rope vectors (the last 64 dims) additionally
  load their slice of the position's table row with the same vector width and rotate in fp32.
- Rows beyond the end and vectors beyond the width are predicated (ragged T, narrow heads).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernels.rope.rotate import ROPE_DIM, rotate_pairs

COPY_BITS = 128
WARPS_PER_CTA = 4


class RopeKernel:
    """Compile-time: dtype, head dim n, fused norm, direction, eps. Rows, heads, positions: runtime."""

    def __init__(self, dtype: type, n: int, norm: bool, inverse: bool, eps: float = 1e-6):
        self.vec = COPY_BITS // dtype.width
        if n % self.vec or n < ROPE_DIM or (n - ROPE_DIM) % self.vec:
            raise ValueError(f"rope needs a head dim that is a multiple of {self.vec} and >= {ROPE_DIM}, got {n}")
        self.dtype, self.n, self.norm, self.inverse, self.eps = dtype, n, norm, inverse, eps
        self.n_vecs = n // self.vec
        self.vecs_per_lane = -(-self.n_vecs // 32)
        self.rope_start = n - ROPE_DIM

    @cute.jit
    def __call__(self, mX: cute.Tensor, mPos: cute.Tensor, mTab: cute.Tensor, mO: cute.Tensor, heads: Int32,
                 stream):
        self.kernel(mX, mPos, mTab, mO, heads).launch(
            grid=[cute.ceil_div(mX.shape[0], WARPS_PER_CTA), 1, 1], block=[32 * WARPS_PER_CTA, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mPos: cute.Tensor, mTab: cute.Tensor, mO: cute.Tensor, heads: Int32):
        v = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        row = bidx * WARPS_PER_CTA + tidx // 32
        gX = cute.zipped_divide(mX, (1, v))  # ((1, v), (rows, n / v))
        gO = cute.zipped_divide(mO, (1, v))
        gT = cute.zipped_divide(mTab, (1, v))
        if row < mX.shape[0]:
            pos = mPos[row // heads]
            rows = cute.make_layout((self.vecs_per_lane, v), stride=(v, 1))  # vector j contiguous
            raw = cute.make_rmem_tensor(rows, mX.element_type)
            raw.fill(0)
            for j in cutlass.range_constexpr(self.vecs_per_lane):
                if lane + 32 * j < self.n_vecs:
                    cute.autovec_copy(gX[(0, None), (row, lane + 32 * j)], raw[j, None])
            x = cute.make_rmem_tensor(rows, Float32)
            x.store(raw.load().to(Float32))
            if cutlass.const_expr(self.norm):
                sum_sq = Float32(0.0)
                for j in cutlass.range_constexpr(self.vecs_per_lane):
                    for i in cutlass.range_constexpr(v):
                        sum_sq += x[j, i] * x[j, i]
                sum_sq = cute.arch.warp_reduction_sum(sum_sq)
                rstd = cute.math.rsqrt(sum_sq / self.n + self.eps)
                for j in cutlass.range_constexpr(self.vecs_per_lane):
                    for i in cutlass.range_constexpr(v):
                        x[j, i] = x[j, i] * rstd
            for j in cutlass.range_constexpr(self.vecs_per_lane):
                col = (lane + 32 * j) * v
                if col >= self.rope_start and col < self.n:
                    cos_sin = cute.make_rmem_tensor((v,), Float32)
                    cute.autovec_copy(gT[(0, None), (pos, (col - self.rope_start) // v)], cos_sin)
                    rotate_pairs(x[j, None], cos_sin, v, self.inverse)
            out = cute.make_rmem_tensor(rows, mO.element_type)
            out.store(x.load().to(mO.element_type))
            for j in cutlass.range_constexpr(self.vecs_per_lane):
                if lane + 32 * j < self.n_vecs:
                    cute.autovec_copy(out[j, None], gO[(0, None), (row, lane + 32 * j)])
