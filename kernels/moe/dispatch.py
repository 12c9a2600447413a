"""MoE dispatch in CuTeDSL: the router's output (expert ids int32 [T, k], route weights fp32 [T, k]) ->
the layout the grouped GEMM reads, with the token activations gathered into it and FP8-quantised.

The layout is oracles/moe.py `dispatch_layout` bit for bit (within an expert the entries keep their
(t, k) order): contiguous (segments padded to the 128-row tile, for prefill) or masked ([E, max_m],
for decode). One jitted call, two launches:

1. `layout` (one CTA of 512 threads per expert e): contiguous, a shared-memory histogram of all T·k ids
   gives every expert's count, hence e's segment offset (masked: e·max_m, no histogram); a pass over the ids
   ranks e's entries
   (ballot-free: each thread owns 16 consecutive entries, a CTA-wide exclusive scan of the per-thread
   match counts gives each its rank), and writes pos[t, j] (the entry's row), and per row src
   (token), expert (DeepGEMM's `grouped_layout`: -1 on padding) and row_weight (the route weight the
   L1 epilogue multiplies by); then its segment's padding rows, and a share of the tail rows past
   the last segment (contiguous). counts[e] is the true count: a masked count above max_m drops the
   entries past max_m (pos = -1) and the glue raises a ValueError after the call.
   Each CTA reads the T·k ids twice, masked once (393 KB at T = 16384: L2-resident after the first CTAs).
2. `gather` (one row of the layout per `threads_per_row` threads): x[src] in bf16 -> FP8 e4m3 codes
   with one ue8m0 power-of-two fp32 scale per 128 (spec §2.3, bit-exact with oracles.quant); zero
   codes and a zero scale on padding rows; the layer's masked layout (skip_padding) runs over the T·k
   assignments instead, writing row pos[t, j], and leaves padding rows unwritten. Scales are written MN-major, as the grouped GEMM's TMA
   reads them (DeepGEMM SM90 and the gemm family's kernel): [G, D/128, rows/G], G = 1 (contiguous)
   or E (masked).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8
from cutlass import memory

from kernels.bits import bits_f32
from kernels.gemm.config import H100_SMS
from kernels.indexer.topk_select import THREADS, WARPS, TopkBlocks
from kernels.quant.numerics import cute_abs, e4m3x2, inv_pow2, ue8m0_exponent

PER = 16  # consecutive ids a thread of the layout kernel owns per step
VEC = 8  # bf16 per 16-byte vector
QBLOCK = 128  # FP8 activation block along K
FP8_MAX, FP8_FLOOR = 448.0, 1e-4
GATHER_CTA = 256
WAVE_CTAS = H100_SMS * (2048 // GATHER_CTA)  # gather CTAs an H100 holds at once (2048 threads an SM)
LAYOUTS = ("contiguous", "masked")


def threads_per_row(d: int) -> int:
    """Threads of one row: 16 (one 128-block of 8-element vectors) times the largest power of two <= 8
    dividing D/128, so every thread has the same number of vectors and a block's 16 lanes are aligned."""
    if d <= 0 or d % QBLOCK:
        raise ValueError(f"d={d} must be a positive multiple of {QBLOCK}")
    return QBLOCK // VEC * math.gcd(d // QBLOCK, 8)


class LayoutKernel(TopkBlocks):
    """Compile-time: experts E, top-k, layout, tile. Runtime: tokens, layout rows."""

    def __init__(self, n_experts: int, topk: int, layout: str, tile: int = 128):
        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
        if n_experts < 1 or topk < 1:
            raise ValueError(f"n_experts={n_experts} and topk={topk} must be positive")
        super().__init__(per_thread=PER)
        self.n_experts, self.topk, self.layout, self.tile = n_experts, topk, layout, tile
        self.pdl = False

    def segment(self, count, max_m):
        if cutlass.const_expr(self.layout == "masked"):
            return max_m
        return (count + Int32(self.tile - 1)) // Int32(self.tile) * Int32(self.tile)

    @cute.kernel
    def kernel(self, mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW):
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.pdl):  # the gather may launch now (it waits for this grid's end)
            cute.arch.griddepcontrol_launch_dependents()
        e, _, _ = cute.arch.block_idx()
        smem = memory.SmemAllocator()
        s_w = smem.allocate_tensor(Int32, cute.make_layout((WARPS,)), byte_alignment=16)
        n, rows = mIdx.shape[0], mSrc.shape[0]
        max_m = rows // self.n_experts
        if cutlass.const_expr(self.layout == "masked"):
            # segment e is rows e·max_m ..: no histogram, no scans over the experts; the rank pass counts e's
            # entries (v9 ran the contiguous layout's histogram and three CTA scans here too: dispatch alone 9.47 ->
            # 8.13 us at Flash T = 1, H200). `used` = rows: the tail-padding loop below runs no iteration
            if e == 0:
                self.unrouted(mIdx, mPos, tidx)
            offset, used = e * max_m, rows
            count = self.rank(mIdx, mW, mPos, mSrc, mExpert, mRowW, e, offset, max_m, s_w, tidx)
        else:
            hist = smem.allocate_tensor(Int32, cute.make_layout((self.n_experts,)), byte_alignment=16)
            offset, used, count = self.segment_offsets(mIdx, mPos, hist, e, max_m, s_w, tidx)
            self.rank(mIdx, mW, mPos, mSrc, mExpert, mRowW, e, offset, max_m, s_w, tidx)
        seg = self.segment(count, max_m)
        for s in cutlass.range(cutlass.min(count, seg) + tidx, seg, THREADS):
            self.pad(mSrc, mExpert, mRowW, offset + s)
        for r in cutlass.range(used + e * THREADS + tidx, rows, self.n_experts * THREADS):
            self.pad(mSrc, mExpert, mRowW, r)
        if tidx == 0:
            mCounts[e] = count

    @cute.jit
    def unrouted(self, mIdx, mPos, tidx):
        """pos = -1 for the entries whose id is no expert (one CTA writes them)."""
        for i in cutlass.range(tidx, mIdx.shape[0], THREADS):
            v = mIdx[i]
            if (v < 0) | (v >= self.n_experts):
                mPos[i] = Int32(-1)

    @cute.jit
    def segment_offsets(self, mIdx, mPos, hist, e, max_m, s_w, tidx):
        """Contiguous: a shared-memory histogram of all ids (CTA 0 marks the unrouted ones) -> (expert e's segment
        offset, the rows every segment uses, e's count)."""
        n_e = self.n_experts
        n = mIdx.shape[0]
        for j in cutlass.range_constexpr((n_e + THREADS - 1) // THREADS):
            if j * THREADS + tidx < n_e:
                hist[j * THREADS + tidx] = Int32(0)
        cute.arch.barrier()
        for first in cutlass.range(tidx * PER, n, THREADS * PER):
            for j in cutlass.range_constexpr(PER):
                if first + j < n:
                    v = mIdx[first + j]
                    if (v >= 0) & (v < n_e):
                        cute.arch.atomic_add(hist.iterator + v, Int32(1))
                    elif e == 0:
                        mPos[first + j] = Int32(-1)  # not routed
        cute.arch.barrier()
        before, total = Int32(0), Int32(0)
        for j in cutlass.range_constexpr((n_e + THREADS - 1) // THREADS):
            ee = j * THREADS + tidx
            if ee < n_e:
                s = self.segment(hist[ee], max_m)
                total += s
                if ee < e:
                    before += s
        _, offset = self.block_scan(before, s_w, tidx)
        _, used = self.block_scan(total, s_w, tidx)
        return offset, used, hist[e]

    @cute.jit
    def rank(self, mIdx, mW, mPos, mSrc, mExpert, mRowW, e, offset, max_m, s_w, tidx):
        """Expert e's entries in (t, k) order get rows offset, offset + 1, ... (masked: < max_m); returns their count."""
        n = mIdx.shape[0]
        seen = Int32(0)
        for base in cutlass.range(0, n, THREADS * PER):
            first = base + tidx * PER
            hits = Int32(0)
            for j in cutlass.range_constexpr(PER):
                if first + j < n:
                    if mIdx[first + j] == e:
                        hits = hits | Int32(1 << j)
            mine, step = self.block_scan(Int32(cute.arch.popc(hits)), s_w, tidx)
            r = seen + mine
            for j in cutlass.range_constexpr(PER):
                if ((hits >> j) & 1) != 0:
                    row = offset + r
                    if cutlass.const_expr(self.layout == "masked"):
                        row = cutlass.select_(r < max_m, row, Int32(-1))
                    mPos[first + j] = row
                    if row >= 0:
                        mSrc[row] = (first + j) // self.topk
                        mExpert[row] = e
                        mRowW[row] = mW[first + j]
                    r += 1
            seen += step
        return seen

    @cute.jit
    def pad(self, mSrc, mExpert, mRowW, row):
        mSrc[row] = Int32(-1)
        mExpert[row] = Int32(-1)
        mRowW[row] = Float32(0.0)


class RowKernel:
    """A row of D bf16 per `threads_per_row` threads, each `vecs` 16-byte vectors; GATHER_CTA threads a CTA."""

    def __init__(self, d: int):
        self.d, self.tpr = d, threads_per_row(d)
        self.vecs = d // VEC // self.tpr
        self.rows_per_cta = GATHER_CTA // self.tpr

    def vec(self, v, lane):
        """The row's 16-byte vector column that lane `lane` of a row group takes in its pass v."""
        return v * self.tpr + lane

    def row_and_lane(self):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        return bidx * self.rows_per_cta + tidx // self.tpr, tidx % self.tpr


class GatherQuantKernel(RowKernel):
    """Compile-time: D, skip_padding. Runtime: tokens, layout rows, scale groups. `skip_padding`: padding rows
    (src -1) are left unwritten (the layer's masked layout: the grouped GEMM never stores a row past its
    expert's count, and a row's products depend on that row alone, so what its codes hold is never seen).
    `by_assignment` (the layer's masked layout): threads over the T·k assignments, writing row pos[t, j], not over
    the E·max_m rows (mostly padding at decode); a row's vector columns in grid y while one wave holds them (past
    it the PDL trigger fires late: docs/perf/moe.md "combine and gather")."""

    def __init__(self, d: int, skip_padding: bool = False, pdl: bool = False, trigger: bool = False,
                 by_assignment: bool = False, topk: int = 1):
        super().__init__(d)
        self.skip_padding, self.pdl, self.trigger = skip_padding, pdl, trigger
        self.by_assignment, self.topk = by_assignment, topk

    @cute.kernel
    def kernel(self, mX, mSrc, mPos, mCodes, mScales):
        if cutlass.const_expr(self.pdl):  # launched with PDL: the layout kernel's rows first
            cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.trigger):  # decode (under one wave): L1 may take SMs as these CTAs exit
            cute.arch.griddepcontrol_launch_dependents()
        row, lane = self.row_and_lane()
        rows = mSrc.shape[0]
        per_group = rows // mScales.shape[0]
        t = Int32(-1)
        if cutlass.const_expr(self.by_assignment):
            dst = Int32(0)
            if row < mPos.shape[0]:
                dst = mPos[row]
                if dst >= 0:
                    t = row // self.topk
            _, col, _ = cute.arch.block_idx()
            _, cols, _ = cute.arch.grid_dim()
            for v in cutlass.range(col, self.vecs, cols, unroll=1):
                self._vector(mX, mCodes, mScales, t, dst, v, lane, per_group, t >= 0)
        else:
            if row < rows:
                t = mSrc[row]
            store = row < rows
            if cutlass.const_expr(self.skip_padding):
                store = store & (t >= 0)
            for v in cutlass.range_constexpr(self.vecs):
                self._vector(mX, mCodes, mScales, t, row, v, lane, per_group, store)

    @cute.jit
    def _vector(self, mX, mCodes, mScales, t, row, v, lane, per_group, store):
        """Vector column v of layout row `row` from x[t] (zeros where t < 0): FP8 codes and, on the block's first
        lane, its ue8m0 scale (zero on padding)."""
        x_tiles = cute.zipped_divide(mX, (1, VEC))
        raw = cute.make_rmem_tensor((VEC,), mX.element_type)
        raw.fill(0)
        if t >= 0:
            cute.autovec_copy(x_tiles[(0, None), (t, self.vec(v, lane))], raw)
        self._quantise(raw, mCodes, mScales, t, row, v, lane, per_group, store)

    @cute.jit
    def _quantise(self, raw, mCodes, mScales, t, row, v, lane, per_group, store):
        """`_vector` past its load: raw (x[t]'s vector column v) -> FP8 codes of row `row` and its block's scale."""
        q_tiles = cute.zipped_divide(mCodes, (1, VEC))
        codes = cute.make_rmem_tensor((VEC,), Uint8)
        vec = self.vec(v, lane)
        x = raw.load().to(Float32)
        amax = cute_abs(x[0])
        for i in cutlass.range_constexpr(1, VEC):
            amax = cute.arch.fmax(amax, cute_abs(x[i]))
        amax = cute.arch.warp_reduction_max(amax, threads_in_group=QBLOCK // VEC)
        exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP8_FLOOR)), 1.0 / FP8_MAX)
        inv_s = inv_pow2(exp)
        for i in cutlass.range_constexpr(VEC // 2):
            pair = e4m3x2(x[2 * i] * inv_s, x[2 * i + 1] * inv_s)
            codes[2 * i] = Uint8(pair & 0xFF)
            codes[2 * i + 1] = Uint8(pair >> 8)
        if store:
            cute.autovec_copy(codes, q_tiles[(0, None), (row, vec)])
            if lane % (QBLOCK // VEC) == 0:
                scale = cutlass.select_(t >= 0, bits_f32(exp << 23), Float32(0.0))
                mScales[row // per_group, vec * VEC // QBLOCK, row % per_group] = scale


class Dispatch:
    """The jitted call: layout, then gather + quant."""

    def __init__(self, n_experts: int, topk: int, d: int, layout: str, tile: int = 128, skip_padding: bool = False,
                 pdl: bool = False):
        """pdl: the gather launched with programmatic dependent launch, triggered by the layout kernel's
        start (the layer's variant `cutedsl:pdl`; the gather then waits in griddepcontrol.wait); masked, the
        gather triggers L1 in turn (a prefill gather of many waves does not: L1's CTAs would take SMs from
        its later waves)."""
        self.layout = LayoutKernel(n_experts, topk, layout, tile)
        self.layout.pdl = pdl
        self.gather = GatherQuantKernel(d, skip_padding, pdl, trigger=pdl and layout == "masked",
                                        by_assignment=skip_padding and layout == "masked", topk=topk)

    @cute.jit
    def __call__(self, mX, mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW, mCodes, mScales, stream):
        self.layout.kernel(mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW).launch(
            grid=[self.layout.n_experts, 1, 1], block=[THREADS, 1, 1], stream=stream)
        g = self.gather
        ctas = cute.ceil_div(mSrc.shape[0], g.rows_per_cta)
        cols = Int32(1)
        if cutlass.const_expr(g.by_assignment):
            ctas = cute.ceil_div(mPos.shape[0], g.rows_per_cta)
            if ctas * g.vecs <= WAVE_CTAS:
                cols = Int32(g.vecs)
        g.kernel(mX, mSrc, mPos, mCodes, mScales).launch(grid=[ctas, cols, 1], block=[g.rows_per_cta * g.tpr, 1, 1],
                                                         stream=stream, use_pdl=g.pdl)
