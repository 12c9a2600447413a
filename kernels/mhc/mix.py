"""mHC mixes in CuTeDSL, pass 1 of hc_pre / hc_head (spec §3.3, §3.5): the [T, 4D] x [4D, n_mix]
product plus the sum of squares of x̄, split over K so that every SM has work.

    part[t, s, m] = Σ_{k in chunk s} x̄[t, k]·fn[m, k]   (m < n_mix),   part[t, s, n_mix] = Σ x̄[t, k]²

v3, a CUDA-core reduction through shared memory (fp32 FMAs, as v1/v2):
- A CTA (128 threads) owns 32·tt tokens (tt = 1, 2, 4 tokens per lane, chosen from T) and one K
  chunk of the split. The chunk streams through shared memory in sub-chunks of 64 columns with
  16-byte cp.async, double-buffered: the x tile [32·tt, 64] bf16 (rows padded by 16 bytes, so the
  lanes' 16-byte reads of 8 consecutive rows hit distinct banks) and the fn tile [n_mix, 64] fp32.
  Every x and fn byte is loaded from global once per CTA, coalesced.
- Lane l of a warp owns tokens l, l+32, …; warps split the work by mix group (hc_pre: 2 groups of
  12 mixes) and by K slice (the rest of the 4 warps). Every fn vector read from shared memory is
  a warp broadcast feeding 8·tt FMAs; every x vector feeds (mixes of the group [+ 1]) × 8 FMAs.
- At the end the K slices' partial sums meet in shared memory (reusing the staging buffers), are
  added in slice order, and the CTA stores its [32·tt, n_mix + 1] block as runs of (n_mix + 1)·4
  bytes into the [T, splits, n_mix + 1] layout that pass 2 (`apply.py`) reads.
One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, cute, memory
from cutlass.cute.nvgpu import cpasync

THREADS = 128
WARPS = THREADS // 32
MAX_CHUNK = 1024
MIN_CHUNK = 128
SUB = 64  # K columns per shared-memory stage
TARGET_CTAS = 264  # two waves of 132 SMs
VEC = 8  # bf16 per 16-byte vector


def tokens_per_lane(tokens: int) -> int:
    """tt: 4 tokens per lane (128 per CTA) at prefill, 2 at 33-64 tokens, 1 below."""
    return 4 if tokens > 64 else 2 if tokens > 32 else 1


def pick_chunk(k: int, tokens: int, tokens_per_cta: int | None = None) -> int:
    """The largest power-of-two K chunk (<= 1024, >= 32) dividing k that still gives ~2 CTAs per SM
    (down to 128 columns)."""
    per_cta = tokens_per_cta or 32 * tokens_per_lane(tokens)
    if k % 32:
        raise ValueError(f"mHC width 4·D = {k} is not a multiple of 32")
    chunk = MAX_CHUNK
    while chunk > 32 and (
        k % chunk
        or (chunk > MIN_CHUNK and -(-tokens // per_cta) * (k // chunk) < TARGET_CTAS)
    ):
        chunk //= 2
    return chunk


def pick_tiling(k: int, tokens: int) -> tuple[int, int]:
    """(tokens per lane, K chunk) of pass 1 at `tokens` tokens: compile-time parameters."""
    tt = tokens_per_lane(tokens)
    return tt, pick_chunk(k, tokens, 32 * tt)


class HcMixKernel:
    """Compile-time: n_mix, K = 4·D, chunk, tokens per lane. Tokens are a runtime size."""

    def __init__(self, n_mix: int, k: int, chunk: int, tt: int = 4):
        if k % chunk or chunk % 32:
            raise ValueError(f"chunk {chunk} must be a multiple of 32 dividing 4·D = {k}")
        if tt not in (1, 2, 4):
            raise ValueError(f"tokens per lane must be 1, 2 or 4, got {tt}")
        self.n_mix, self.k, self.chunk, self.tt = n_mix, k, chunk, tt
        self.vec = VEC
        self.tokc = 32 * tt  # tokens per CTA
        self.sub = min(chunk, SUB)
        self.groups = 2 if n_mix % 2 == 0 and n_mix >= 16 else 1  # mix groups (warps)
        self.slices = WARPS // self.groups  # K slices (warps)
        self.mpg = n_mix // self.groups  # mixes per group
        self.kv_per_warp = self.sub // VEC // self.slices  # 16-byte k vectors per warp per stage
        self.row = self.sub + VEC  # padded x row (bf16 elements)

    @property
    def splits(self) -> int:
        return self.k // self.chunk

    def smem_words(self) -> int:
        """fp32 words of shared memory: the two stages, or the slice reduction if larger."""
        stage = 2 * (self.tokc * self.row // 2 + self.n_mix * self.sub)
        red = self.slices * self.tokc * (self.n_mix + 1)
        return max(stage, red)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor, stream):
        self.kernel(mX, mFn, mPart).launch(
            grid=[cute.ceil_div(mX.shape[0], self.tokc), self.splits, 1],
            block=[THREADS, 1, 1],
            stream=stream,
        )

    @cute.jit
    def issue(self, gX, gF, sXc, sFc, t0, n_tok, col0, st):
        """cp.async the x tile [tokc, sub] and the fn tile [n_mix, sub] from column col0 into stage st."""
        tidx, _, _ = cute.arch.thread_idx()
        vpr = self.sub // VEC  # 16-byte vectors per x row
        atom_x = cute.make_copy_atom(
            cpasync.CopyG2SOp(), gX.element_type, num_bits_per_copy=128
        )
        atom_f = cute.make_copy_atom(
            cpasync.CopyG2SOp(), gF.element_type, num_bits_per_copy=128
        )
        for j in cutlass.range_constexpr(self.tokc * vpr // THREADS):
            e = tidx + THREADS * j
            r = e // vpr
            if r < n_tok:
                cute.copy(
                    atom_x,
                    gX[(0, None), (t0 + r, col0 // VEC + e % vpr)],
                    sXc[None, (st, r, e % vpr)],
                )
        fpr = self.sub // 4  # 16-byte vectors per fn row
        n_f = self.n_mix * fpr
        for j in cutlass.range_constexpr(-(-n_f // THREADS)):
            e = tidx + THREADS * j
            if cutlass.const_expr(n_f % THREADS == 0) or e < n_f:
                cute.copy(
                    atom_f,
                    gF[(0, None), (e // fpr, col0 // 4 + e % fpr)],
                    sFc[None, (st, e // fpr, e % fpr)],
                )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor):
        n_mix, tt, tokc, sub, row = self.n_mix, self.tt, self.tokc, self.sub, self.row
        mpg, kvw = self.mpg, self.kv_per_warp
        m1 = n_mix + 1
        tidx, _, _ = cute.arch.thread_idx()
        bidx, split, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = cute.arch.make_warp_uniform(tidx // 32)
        grp = warp % self.groups  # mix group: mixes grp·mpg …; group 0 also Σx²
        ks = warp // self.groups  # K slice of every stage
        n_tokens = mX.shape[0]
        t0 = bidx * tokc
        n_tok = cutlass.min(tokc, n_tokens - t0)
        gX = cute.zipped_divide(mX, (1, VEC))  # ((1, 8), (T, K/8))
        gF = cute.zipped_divide(mFn, (1, 4))  # ((1, 4), (n_mix, K/4))

        smem = memory.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout(self.smem_words()), 128)
        x_words = 2 * tokc * row // 2
        x_ptr = cute.recast_ptr(buf.iterator, dtype=mX.element_type)
        # x stages: [2][tokc][row] bf16, viewed as 16-byte vectors ((8), (stage, token, vector))
        sXc = cute.make_tensor(
            x_ptr,
            cute.make_layout(
                (VEC, (2, tokc, sub // VEC)), stride=(1, (tokc * row, row, VEC))
            ),
        )
        # fn stages: [2][n_mix][sub] fp32, as 4-float copy vectors and as 8-float read vectors
        f_ptr = buf.iterator + x_words
        sFc = cute.make_tensor(
            f_ptr,
            cute.make_layout((4, (2, n_mix, sub // 4)), stride=(1, (n_mix * sub, sub, 4))),
        )
        sFr = cute.make_tensor(
            f_ptr,
            cute.make_layout(
                (VEC, (2, n_mix, sub // VEC)), stride=(1, (n_mix * sub, sub, VEC))
            ),
        )

        acc = cute.make_rmem_tensor(cute.make_layout((tt, mpg + 1), stride=(mpg + 1, 1)), Float32)
        acc.fill(0.0)
        col0 = split * self.chunk
        n_sub = self.chunk // sub
        self.issue(gX, gF, sXc, sFc, t0, n_tok, col0, 0)
        cute.arch.cp_async_commit_group()
        raw = cute.make_rmem_tensor((VEC,), mX.element_type)
        xs = cute.make_rmem_tensor(cute.make_layout((VEC, tt), stride=(1, VEC)), Float32)
        w = cute.make_rmem_tensor((VEC,), Float32)
        for s in cutlass.range(n_sub, unroll=1):
            st = s % 2
            if s + 1 < n_sub:
                self.issue(gX, gF, sXc, sFc, t0, n_tok, col0 + (s + 1) * sub, 1 - st)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.barrier()
            for kk in cutlass.range(kvw, unroll=1):
                kv = ks * kvw + kk
                for u in cutlass.range_constexpr(tt):
                    cute.autovec_copy(sXc[None, (st, lane + 32 * u, kv)], raw)
                    xs[None, u].store(raw.load().to(Float32))
                if grp == 0:
                    for u in cutlass.range_constexpr(tt):
                        for i in cutlass.range_constexpr(VEC):
                            acc[u, mpg] += xs[i, u] * xs[i, u]
                for m in cutlass.range_constexpr(mpg):
                    cute.autovec_copy(sFr[None, (st, grp * mpg + m, kv)], w)
                    for u in cutlass.range_constexpr(tt):
                        for i in cutlass.range_constexpr(VEC):
                            acc[u, m] += xs[i, u] * w[i]
            cute.arch.barrier()

        # the K slices meet in shared memory: s_red[slice][token][m] (odd row stride m1: lanes'
        # rows hit distinct banks), then thread e of the block sums element e over the slices
        s_red = cute.make_tensor(
            buf.iterator,
            cute.make_layout((self.slices, tokc, m1), stride=(tokc * m1, m1, 1)),
        )
        for u in cutlass.range_constexpr(tt):
            for m in cutlass.range_constexpr(mpg):
                s_red[ks, lane + 32 * u, grp * mpg + m] = acc[u, m]
            if grp == 0:
                s_red[ks, lane + 32 * u, n_mix] = acc[u, mpg]
        cute.arch.barrier()
        s_flat = cute.make_tensor(buf.iterator, cute.make_layout(self.slices * tokc * m1))
        for j in cutlass.range_constexpr(-(-(tokc * m1) // THREADS)):
            e = tidx + THREADS * j
            if e < tokc * m1:
                t = e // m1
                if t < n_tok:
                    total = s_flat[e]
                    for q in cutlass.range_constexpr(1, self.slices):
                        total += s_flat[q * tokc * m1 + e]
                    mPart[t0 + t, split, e % m1] = total
