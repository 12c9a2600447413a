"""mHC mixes in CuTeDSL, pass 1 of hc_pre / hc_head (spec §3.3, §3.5): the [T, 4D] x [4D, n_mix]
product plus the sum of squares of x̄, split over K so that every SM has work.

    part[s, m, t] = Σ_{k in chunk s} x̄[t, k]·fn[m, k]   (m < n_mix),   part[s, n_mix, t] = Σ x̄[t, k]²

A CUDA-core reduction: thread = token, so each fn value is loaded once per warp (a broadcast,
L1-resident) and feeds 32 tokens' FMAs; each thread streams its own token's chunk in 16-byte
vectors and keeps n_mix + 1 fp32 accumulators. The partials are written token-contiguous
(coalesced) and reduced by pass 2 (`apply.py`). One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

COPY_BITS = 128
THREADS = 128
MAX_CHUNK = 1024
MIN_CHUNK = 128
TARGET_CTAS = 264  # two waves of 132 SMs


def pick_chunk(k: int, tokens: int, vec: int = 8) -> int:
    """The largest power-of-two K chunk (<= 1024) dividing k that still gives ~2 CTAs per SM."""
    chunk = MAX_CHUNK
    while chunk > vec and (k % chunk or (chunk > MIN_CHUNK and -(-tokens // THREADS) * (k // chunk) < TARGET_CTAS)):
        chunk //= 2
    if k % chunk:
        raise ValueError(f"mHC width 4·D = {k} is not a multiple of {vec}")
    return chunk


class HcMixKernel:
    """Compile-time: n_mix, K = 4·D, chunk. Tokens are a runtime size."""

    def __init__(self, n_mix: int, k: int, chunk: int):
        if k % chunk or chunk % 8:
            raise ValueError(f"chunk {chunk} must be a multiple of 8 dividing 4·D = {k}")
        self.n_mix, self.k, self.chunk = n_mix, k, chunk
        self.vec = 8

    @property
    def splits(self) -> int:
        return self.k // self.chunk

    @cute.jit
    def __call__(self, mX: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor, stream):
        self.kernel(mX, mFn, mPart).launch(
            grid=[cute.ceil_div(mX.shape[0], THREADS), self.splits, 1], block=[THREADS, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor):
        v, n_mix = self.vec, self.n_mix
        tidx, _, _ = cute.arch.thread_idx()
        bidx, split, _ = cute.arch.block_idx()
        token = bidx * THREADS + tidx
        gX = cute.zipped_divide(mX, (1, v))
        gF = cute.zipped_divide(mFn, (1, v))
        acc = cute.make_rmem_tensor((n_mix + 1,), Float32)
        acc.fill(0.0)
        if token < mX.shape[0]:
            raw = cute.make_rmem_tensor((v,), mX.element_type)
            w = cute.make_rmem_tensor((v,), Float32)
            first = split * (self.chunk // v)
            for c in cutlass.range(self.chunk // v, unroll=2):
                cute.autovec_copy(gX[(0, None), (token, first + c)], raw)
                x = raw.load().to(Float32)
                xs = cute.make_rmem_tensor((v,), Float32)
                xs.store(x)
                for i in cutlass.range_constexpr(v):
                    acc[n_mix] += xs[i] * xs[i]
                for m in cutlass.range_constexpr(n_mix):
                    cute.autovec_copy(gF[(0, None), (m, first + c)], w)
                    for i in cutlass.range_constexpr(v):
                        acc[m] += xs[i] * w[i]
            for m in cutlass.range_constexpr(n_mix + 1):
                mPart[split, m, token] = acc[m]
