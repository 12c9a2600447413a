"""mHC mixes in CuTeDSL, pass 1 of hc_pre / hc_head (spec §3.3, §3.5): the [T, 4D] x [4D, n_mix]
product plus the sum of squares of x̄, split over K so that every SM has work.

    part[t, s, m] = Σ_{k in chunk s} x̄[t, k]·fn[m, k]   (m < n_mix),   part[t, s, n_mix] = Σ x̄[t, k]²

A CUDA-core reduction: thread = token, so each fn value is loaded once per warp (a broadcast,
L1-resident) and feeds 32 tokens' FMAs; each thread streams its own token's chunk in 16-byte
vectors and keeps n_mix + 1 fp32 accumulators. The partials are laid out [T, splits, n_mix + 1]
(a token's partials contiguous, so that pass 2 (`apply.py`) can stage one token block's in one
coalesced sweep); the CTA transposes its 128 x (n_mix + 1) block through shared memory so that
the stores run along m (runs of (n_mix + 1)·4 bytes). One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, cute, memory

COPY_BITS = 128
THREADS = 128
MAX_CHUNK = 1024
MIN_CHUNK = 128
TARGET_CTAS = 264  # two waves of 132 SMs


def pick_chunk(k: int, tokens: int, vec: int = 8) -> int:
    """The largest power-of-two K chunk (<= 1024) dividing k that still gives ~2 CTAs per SM."""
    chunk = MAX_CHUNK
    while chunk > vec and (
        k % chunk
        or (chunk > MIN_CHUNK and -(-tokens // THREADS) * (k // chunk) < TARGET_CTAS)
    ):
        chunk //= 2
    if k % chunk:
        raise ValueError(f"mHC width 4·D = {k} is not a multiple of {vec}")
    return chunk


class HcMixKernel:
    """Compile-time: n_mix, K = 4·D, chunk. Tokens are a runtime size."""

    def __init__(self, n_mix: int, k: int, chunk: int):
        if k % chunk or chunk % 8:
            raise ValueError(
                f"chunk {chunk} must be a multiple of 8 dividing 4·D = {k}"
            )
        self.n_mix, self.k, self.chunk = n_mix, k, chunk
        self.vec = 8

    @property
    def splits(self) -> int:
        return self.k // self.chunk

    @cute.jit
    def __call__(self, mX: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor, stream):
        self.kernel(mX, mFn, mPart).launch(
            grid=[cute.ceil_div(mX.shape[0], THREADS), self.splits, 1],
            block=[THREADS, 1, 1],
            stream=stream,
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
        # transpose through shared memory: thread tidx's accumulators are row tidx (odd stride
        # n_mix + 1: conflict-free), then the block is stored element e = (token, m) by thread e % 128
        m1 = n_mix + 1
        smem = memory.SmemAllocator()
        s_acc = smem.allocate_tensor(Float32, cute.make_layout(THREADS * m1), 16)
        for m in cutlass.range_constexpr(m1):
            s_acc[tidx * m1 + m] = acc[m]
        cute.arch.barrier()
        for j in cutlass.range_constexpr(m1):
            e = tidx + THREADS * j
            t = bidx * THREADS + e // m1
            if t < mX.shape[0]:
                mPart[t, split, e % m1] = s_acc[e]
