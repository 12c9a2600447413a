"""mHC mixes in CuTeDSL, pass 1 of hc_pre / hc_head (spec §3.3, §3.5): the [T, 4D] x [4D, n_mix]
product plus the sum of squares of x̄, split over K so that every SM has work.

    part[t, s, m] = Σ_{k in chunk s} x̄[t, k]·fn[m, k]   (m < n_mix),   part[t, s, n_mix] = Σ x̄[t, k]²

v4, the mixes on tensor cores (warp MMA m16n8k16, bf16 operands, fp32 accumulators):
- A CTA (128 threads, 4 warps) owns 64·tm tokens (tm = 1, 2 MMA row tiles per warp, chosen from
  T) and one K chunk of the split. The chunk streams through shared memory in sub-chunks of 64
  columns with 16-byte cp.async, double-buffered: the x tile [64·tm, 64] bf16 and the fn tile
  [np, 64] fp32 (np = n_mix rounded up to 8; the pad rows are zero). Rows are padded by 16 B (x)
  and 32 B (fn), so the MMA fragment reads (8 rows x 4 lanes) hit distinct banks.
- fn is fp32: each warp reads its B fragments from the fp32 tile and splits them in registers
  into hi = bf16(fn), lo = bf16(fn − hi); the accumulator takes x·hi + x·lo. bf16 x is exact, the
  bf16 products are exact in the fp32 accumulate, and |fn − hi − lo| ≤ 2^-16·|fn| (TF32, the
  family's low-precision reference, is 2^-11): see docs/perf/mhc.md, "Roofline".
- Warp w computes the 16-token row tiles w (and w + 4 when tm = 2) x all np mixes; Σx² stays on
  CUDA cores: thread i sums half a row (32 columns, four 16-byte reads) of token i / 2 (and
  i / 2 + 64) per stage.
- At the end the accumulators and Σx² meet in shared memory (the staging buffers reused), and the
  CTA stores its [64·tm, n_mix + 1] block as runs of (n_mix + 1)·4 bytes into the
  [T, splits, n_mix + 1] layout that pass 2 (`apply.py`) reads.
One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
from cutlass import BFloat16, Float32, cute, memory
from cutlass.cute.nvgpu import cpasync, warp

THREADS = 128
WARPS = THREADS // 32
MAX_CHUNK = 1024
MIN_CHUNK = 128
SUB = 64  # K columns per shared-memory stage
TARGET_CTAS = 264  # two waves of 132 SMs
ONE_WAVE_CTAS = 128  # a grid this small is resident at once on an H100 (132 SMs) or a B200 (148)
VEC = 8  # bf16 per 16-byte vector
MMA_M = 16  # rows of one warp MMA tile (m16n8k16)


def row_tiles(tokens: int) -> int:
    """tm: MMA row tiles per warp, 2 (128 tokens per CTA) above 64 tokens, else 1 (64)."""
    return 2 if tokens > 64 else 1


def pick_chunk(k: int, tokens: int, tokens_per_cta: int) -> int:
    """The largest power-of-two K chunk (<= 1024, >= 32) dividing k that still gives ~2 CTAs per SM
    (down to 128 columns)."""
    if k % 32:
        raise ValueError(f"mHC width 4·D = {k} is not a multiple of 32")
    chunk = MAX_CHUNK
    while chunk > 32 and (
        k % chunk
        or (chunk > MIN_CHUNK and -(-tokens // tokens_per_cta) * (k // chunk) < TARGET_CTAS)
    ):
        chunk //= 2
    return chunk


def pick_tiling(k: int, tokens: int) -> tuple[int, int]:
    """(row tiles per warp, K chunk) of pass 1 at `tokens` tokens: compile-time parameters."""
    tm = row_tiles(tokens)
    return tm, pick_chunk(k, tokens, WARPS * MMA_M * tm)


class HcMixKernel:
    """Compile-time: n_mix, K = 4·D, chunk, row tiles per warp. Tokens are a runtime size."""

    def __init__(self, n_mix: int, k: int, chunk: int, tm: int = 2):
        if k % chunk or chunk % 32:
            raise ValueError(f"chunk {chunk} must be a multiple of 32 dividing 4·D = {k}")
        if tm not in (1, 2):
            raise ValueError(f"row tiles per warp must be 1 or 2, got {tm}")
        self.n_mix, self.k, self.chunk, self.tm = n_mix, k, chunk, tm
        self.np = -(-n_mix // 8) * 8  # MMA N: mixes padded to 8
        self.tokc = WARPS * MMA_M * tm  # tokens per CTA
        self.sub = min(chunk, SUB)
        self.xrow = self.sub + VEC  # padded x row (bf16): 16 B pad
        self.frow = self.sub + 8  # padded fn row (fp32): 32 B pad
        self.crow = self.np + 1  # reduction row (fp32): np mixes + Σx²

    @property
    def splits(self) -> int:
        return self.k // self.chunk

    def x_words(self) -> int:
        return 2 * self.tokc * self.xrow // 2

    def smem_words(self) -> int:
        """fp32 words of shared memory: the two stages, or the epilogue block if larger."""
        stage = self.x_words() + 2 * self.np * self.frow
        return max(stage, self.tokc * self.crow)

    def tiled_mma(self):
        op = warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16))
        return cute.make_tiled_mma(
            op, cute.make_layout((WARPS, 1, 1)), permutation_mnk=(self.tokc, self.np, 16)
        )

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
        n_mix, np_, tokc, sub, xrow, frow = (
            self.n_mix, self.np, self.tokc, self.sub, self.xrow, self.frow
        )
        m1, crow = n_mix + 1, self.crow
        # Pass 2 is launched with programmatic dependent launch: it may be scheduled once every CTA
        # of this grid has triggered (or exited), then loads x and waits for these partials. A grid
        # that fits one wave triggers at once (decode: pass 2's launch and x loads overlap this
        # pass); a bigger one at the end of each CTA, so that pass 2's CTAs do not take the SMs
        # this grid's later waves need (prefill got 3.5% slower with the early trigger).
        gx, gy, _ = cute.arch.grid_dim()
        one_wave = gx * gy <= ONE_WAVE_CTAS
        if one_wave:
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, split, _ = cute.arch.block_idx()
        n_tokens = mX.shape[0]
        t0 = bidx * tokc
        n_tok = cutlass.min(tokc, n_tokens - t0)
        gX = cute.zipped_divide(mX, (1, VEC))  # ((1, 8), (T, K/8))
        gF = cute.zipped_divide(mFn, (1, 4))  # ((1, 4), (n_mix, K/4))

        smem = memory.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout(self.smem_words()), 128)
        x_ptr = cute.recast_ptr(buf.iterator, dtype=mX.element_type)
        f_ptr = buf.iterator + self.x_words()
        # x stages [2][tokc][xrow] bf16: as 16-byte copy vectors and as [tokc, sub] MMA tiles
        sXc = cute.make_tensor(
            x_ptr,
            cute.make_layout((VEC, (2, tokc, sub // VEC)), stride=(1, (tokc * xrow, xrow, VEC))),
        )
        sX = cute.make_tensor(
            x_ptr, cute.make_layout((tokc, sub, 2), stride=(xrow, 1, tokc * xrow))
        )
        # fn stages [2][np][frow] fp32: as 4-float copy vectors and as [np, sub] tiles
        sFc = cute.make_tensor(
            f_ptr,
            cute.make_layout((4, (2, np_, sub // 4)), stride=(1, (np_ * frow, frow, 4))),
        )
        sF = cute.make_tensor(
            f_ptr, cute.make_layout((np_, sub, 2), stride=(frow, 1, np_ * frow))
        )
        # the pad rows of fn (mixes n_mix .. np - 1) are zero in both stages
        if cutlass.const_expr(np_ > n_mix):
            for j in cutlass.range_constexpr(-(-(2 * (np_ - n_mix) * sub) // THREADS)):
                e = tidx + THREADS * j
                if e < 2 * (np_ - n_mix) * sub:
                    q = e // sub
                    sF[n_mix + q // 2, e % sub, q % 2] = Float32(0.0)

        tiled_mma = self.tiled_mma()
        thr = tiled_mma.get_slice(tidx)
        tCsA = thr.partition_A(sX)  # (frag, tm, sub/16, stage)
        tCsB = thr.partition_B(sF)  # (frag, np/8, sub/16, stage) fp32
        tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
        # bf16 B fragments: the layout of a bf16 view of the fn tile (only its shape is used)
        sFb = cute.make_tensor(x_ptr, cute.make_layout((np_, sub), stride=(sub, 1)))
        tCrBh = tiled_mma.make_fragment_B(thr.partition_B(sFb))
        tCrBl = tiled_mma.make_fragment_B(thr.partition_B(sFb))
        acc = tiled_mma.make_fragment_C(thr.partition_shape_C((tokc, np_)))
        acc.fill(0.0)
        # Σx²: thread i owns half a row (sub / 2 columns) of tokens i / 2 + 64·u (u < tm)
        sq = cute.make_rmem_tensor((self.tm,), Float32)
        sq.fill(0.0)
        sq_tok = tidx // 2
        sq_v0 = (tidx % 2) * (sub // VEC // 2)
        raw = cute.make_rmem_tensor((VEC,), mX.element_type)

        col0 = split * self.chunk
        n_sub = self.chunk // sub
        self.issue(gX, gF, sXc, sFc, t0, n_tok, col0, 0)
        cute.arch.cp_async_commit_group()
        for s in cutlass.range(n_sub, unroll=1):
            st = s % 2
            if s + 1 < n_sub:
                self.issue(gX, gF, sXc, sFc, t0, n_tok, col0 + (s + 1) * sub, 1 - st)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.barrier()
            for kb in cutlass.range_constexpr(sub // 16):
                cute.autovec_copy(tCsA[None, None, kb, st], tCrA[None, None, kb])
                f = tCsB[None, None, kb, st].load()
                hi = f.to(BFloat16)
                tCrBh[None, None, kb].store(hi)
                tCrBl[None, None, kb].store((f - hi.to(Float32)).to(BFloat16))
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrBh[None, None, kb], acc)
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrBl[None, None, kb], acc)
            for u in cutlass.range_constexpr(self.tm):
                for v in cutlass.range_constexpr(sub // VEC // 2):
                    cute.autovec_copy(sXc[None, (st, sq_tok + 64 * u, sq_v0 + v)], raw)
                    xv = raw.load().to(Float32)
                    for i in cutlass.range_constexpr(VEC):
                        sq[u] += xv[i] * xv[i]
            cute.arch.barrier()

        # epilogue: s_c[token][np + 1] (odd row stride), mixes from the accumulators, Σx² at np
        s_c = cute.make_tensor(buf.iterator, cute.make_layout((tokc, crow), stride=(crow, 1)))
        tCsC = thr.partition_C(cute.make_tensor(buf.iterator, cute.make_layout((tokc, np_), stride=(crow, 1))))
        cute.autovec_copy(acc, tCsC)
        cute.arch.barrier()
        for u in cutlass.range_constexpr(self.tm):
            total = sq[u] + cute.arch.shuffle_sync_bfly(sq[u], offset=1)
            if tidx % 2 == 0:
                s_c[sq_tok + 64 * u, np_] = total
        cute.arch.barrier()
        for j in cutlass.range_constexpr(-(-(tokc * m1) // THREADS)):
            e = tidx + THREADS * j
            if e < tokc * m1:
                t = e // m1
                m = e % m1
                if t < n_tok:
                    if m < n_mix:
                        mPart[t0 + t, split, m] = s_c[t, m]
                    else:
                        mPart[t0 + t, split, m] = s_c[t, np_]
        if not one_wave:
            cute.arch.griddepcontrol_launch_dependents()
