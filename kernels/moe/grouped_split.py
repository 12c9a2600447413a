"""v3 (prefill) of the grouped expert GEMM: the two consumer warpgroups decoupled (GroupedConfig.split_wg,
variant `cutedsl:split-wg`; docs/perf/moe.md "v3 (prefill)").

In the v2 kernel (kernels/moe/grouped_sm90.py) the 256 consumer threads widen the whole 256-row FP4 tile
together (thread t takes rows t/4, 64 + t/4, ...: both warpgroups write rows the other one's wgmma reads) and
so meet at a 256-thread barrier every K block. Both warpgroups then run in lockstep: both issue wave 0's
wgmmas, both wait, both promote (the tensor core idles: ~340 issue cycles of the SM's ~1650 a K block at
bm = 128), both issue wave 1, both promote again.

Here each warpgroup widens only the 128 weight rows its own wgmma reads (rows [128 h, 128 h + 128) of the
tile: the tiled MMA's (1, 2, 1) atom layout gives warpgroup h those N columns), into its own half of the
double-buffered widened tile, and publishes them with a 128-thread named barrier of its own (ids 2 and 3).
Nothing a K block forces the two warpgroups to meet: the stage ring (each warp releases its stage) and the
L1 epilogue's amax exchange (once a tile) are what they share. Once they drift apart (the wgmma groups of the
two warpgroups complete one after the other), one warpgroup's promotion and widening overlap the other's
wgmmas. The widening work, the promotion, the epilogues and every index of the v2 kernel stay as they are
(`GroupedSplit` overrides `_consume` and `_prepare`, and `_store_h` only under `fast_silu`; the v2 classes and
their code path are untouched).

The L1 epilogue's amax exchange buffer (`red`, one slot per (row, warpgroup, wave)) is written before and read
after a 256-thread barrier. With one wave (bm 64) a warpgroup free to drift could write the next tile's slot
while the other still reads this tile's: a closing 256-thread barrier after each L1 tile orders them. With two
waves (prefill) the barriers of the waves already do: the next tile's wave-0 write comes after this tile's
wave-1 barrier (every wave-0 read is before it), its wave-1 write after the next tile's wave-0 barrier.

`GroupedSplitRow` (row_frame) overrides `_kblock`: the promotion with row scales alone (weights prepared in the
row frame, kernels/moe/expert_weights.prepare). `fast_silu`: L1's silu by rcp.approx and 2-byte h stores.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, Uint16

from cutlass.cute.nvgpu import warpgroup

from kernels.bits import bits_f32
from kernels.fmha.softmax import quad_allreduce
from kernels.moe.grouped_config import WIDEN_TABLE_WORDS
from kernels.moe.grouped_epilogue import FP8_FLOOR, FP8_MAX, LIMIT, LOG2E, GroupedEpilogues
from kernels.moe.grouped_sm90 import SUBS, GroupedSm90, widen8
from kernels.quant.numerics import bf16x2_bits, cute_abs, e4m3x2, inv_pow2, ue8m0_exponent
from kernels.regs import fence_operand, mn_view

WG_BARRIER = 2  # named barrier ids 2 and 3: one per consumer warpgroup (1: the 256-thread one; 0: the CTA's)


class GroupedSplit(GroupedSm90):
    @cute.jit
    def _consume(self, ring, tiled_mma, mma_acc, sA, sB, sSh, sSW, sSA, st, mTab, mGroup, mRowW, mOut, mOutS,
                 n_groups, tiles_n, n_kb, units, mg, bidx, gdim, ctid):
        c = self.cfg
        W = c.waves
        tab = st.tab.get_tensor(cute.make_layout((WIDEN_TABLE_WORDS,)))
        if ctid < WIDEN_TABLE_WORDS:
            tab[ctid] = mTab[ctid]
        thr_mma = tiled_mma.get_slice(ctid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_shape_C((64, c.bn))
        accs = [cute.make_rmem_tensor(acc_shape, Float32) for _ in range(W)]
        tmp = cute.make_rmem_tensor(acc_shape, Float32)
        cC = mn_view(thr_mma.partition_C(cute.make_identity_tensor((64, c.bn))))
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)  # both warpgroups
        half = cute.arch.make_warp_uniform(ctid // 128)
        wg_bar = pipeline.NamedBarrier(barrier_id=WG_BARRIER + half, num_threads=128)  # this warpgroup
        bar.arrive_and_wait()  # the table is in
        g_rd = Int32(0)
        for u in cutlass.range(bidx, units, gdim, unroll=1):
            g, mt, nt, e, limit = self._unit(u, tiles_n, n_groups, mg, mGroup, st)
            for w in cutlass.range_constexpr(W):
                accs[w].fill(0.0)
            self._prepare(ring, st, sSh, tab, g_rd, ctid)
            wg_bar.arrive_and_wait()
            for kb in cutlass.range(0, n_kb, unroll=1):
                self._kblock(ring, (tiled_mma, mma_acc), tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, wg_bar,
                             g_rd, kb + 1 < n_kb, ctid)
                g_rd = g_rd + 1
            for w in cutlass.range_constexpr(W):
                m0 = mt * c.bm + w * 64
                if cutlass.const_expr(c.epilogue == "swiglu"):
                    self._store_h(accs[w], cC, st, bar, mRowW, mOut, mOutS, g, m0, nt, limit, mg, w, ctid)
                else:
                    self._store_rows(accs[w], cC, mOut, g, m0, nt, limit, mg)
            if cutlass.const_expr(c.epilogue == "swiglu" and W == 1):
                bar.arrive_and_wait()  # every read of `red` for this tile is done before the next tile's writes

    @cute.jit
    def _store_h(self, acc, cC, st, bar, mRowW, mOut, mOutS, g, m0, nt, limit, mg, w, ctid):
        """Layer 1's epilogue: v2's (kernels/moe/grouped_epilogue.py) unless `fast_silu`: then silu's division
        is g · rcp.approx(1 + 2^(−g·log2 e)) (MUFU.RCP + FMUL; v2: the IEEE division, ~8 instructions, a
        slow-path branch and its convergence barrier an element) and each e4m3 pair goes out as one 2-byte
        store (v2: two 1-byte stores). rcp.approx is within 1 ulp; h is then rounded to bf16 as before."""
        if cutlass.const_expr(not self.cfg.fast_silu):
            GroupedEpilogues._store_h(self, acc, cC, st, bar, mRowW, mOut, mOutS, g, m0, nt, limit, mg, w, ctid)
        else:
            acc_mn = mn_view(acc)
            n_r, n_c = cute.size(cC, mode=[0]), cute.size(cC, mode=[1])
            red = st.red.get_tensor(cute.make_layout((64, 2, self.cfg.waves)))
            out16 = cute.make_tensor(cute.recast_ptr(mOut.iterator, dtype=Uint16),
                                     cute.make_layout((mOut.shape[0], mOut.shape[1] // 2),
                                                      stride=(mOut.shape[1] // 2, 1)))
            half = ctid // 128
            h = cute.make_rmem_tensor((n_r, n_c // 2), Float32)
            for r in cutlass.range_constexpr(n_r):
                m = m0 + cC[r, 0][0]
                rw = Float32(0.0)
                if m < limit:
                    rw = mRowW[g * mg + m]
                amax = Float32(0.0)
                for q in cutlass.range_constexpr(n_c // 4):
                    gate = bf16x2_bits(acc_mn[r, 4 * q], acc_mn[r, 4 * q + 1])
                    up = bf16x2_bits(acc_mn[r, 4 * q + 2], acc_mn[r, 4 * q + 3])
                    for p in cutlass.range_constexpr(2):
                        gv = bits_f32((gate << 16) if p == 0 else (gate & Int32(-65536)))
                        uv = bits_f32((up << 16) if p == 0 else (up & Int32(-65536)))
                        gv = cute.arch.fmin(gv, Float32(LIMIT))
                        uv = cute.arch.fmax(cute.arch.fmin(uv, Float32(LIMIT)), Float32(-LIMIT))
                        silu = gv * cute.arch.rcp_approx(Float32(1.0) + cute.arch.exp2(gv * Float32(-LOG2E)))
                        h[r, 2 * q + p] = silu * uv * rw
                    hb = bf16x2_bits(h[r, 2 * q], h[r, 2 * q + 1])
                    h[r, 2 * q] = bits_f32(hb << 16)
                    h[r, 2 * q + 1] = bits_f32(hb & Int32(-65536))
                    amax = cute.arch.fmax(amax, cute.arch.fmax(cute_abs(h[r, 2 * q]), cute_abs(h[r, 2 * q + 1])))
                amax = quad_allreduce(amax, cute.arch.fmax)
                if ctid % 4 == 0:
                    red[cC[r, 0][0], half, w] = amax
            bar.arrive_and_wait()
            for r in cutlass.range_constexpr(n_r):
                row = cC[r, 0][0]
                m = m0 + row
                if m < limit:
                    amax = cute.arch.fmax(red[row, 0, w], red[row, 1, w])
                    exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP8_FLOOR)), 1.0 / FP8_MAX)
                    inv = inv_pow2(exp)
                    for q in cutlass.range_constexpr(n_c // 4):
                        col = cC[r, 4 * q][1]  # gate column of the pair: intermediate 8 (col // 16) + col % 8, even
                        i = nt * (self.cfg.bn // 2) + (col // 16) * 8 + col % 8
                        pair = e4m3x2(h[r, 2 * q] * inv, h[r, 2 * q + 1] * inv)
                        out16[g * mg + m, i // 2] = Uint16(pair & 0xFFFF)
                    if (half == 0) & (ctid % 4 == 0):
                        mOutS[m, nt, g] = bits_f32(exp << 23)

    @cute.jit
    def _prepare(self, ring, st, sSh, tab, g_rd, ctid):
        """Wait for K block g_rd's stage and widen this warpgroup's 128 rows of its FP4 tile into its half of
        B buffer g_rd % 2, fenced for the wgmma; the caller's warpgroup barrier publishes it."""
        state = self._stage(g_rd)
        ring.consumer_wait(state)
        if cutlass.const_expr(self.cfg.ablate != "no-widen"):
            self._widen_half(st, sSh, tab, state.index, g_rd % 2, ctid)
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def _widen_half(self, st, sSh, tab, stage, buf, ctid):
        """v2's widening (`_widen_v2`: the loads first, `widen8`, two 16-byte swizzled stores an item) over
        the warpgroup's rows only: item i of warpgroup h is row 128 h + i / 4, sub-block i % 4 (a quarter-warp's
        8 stores still cover rows n, n + 1, all 32 banks)."""
        c = self.cfg
        rows = c.bn // c.n_mma_wg
        steps = rows * SUBS // 128
        half = ctid // 128
        lt = ctid % 128
        q4 = cute.make_tensor(cute.recast_ptr(st.sQ.data_ptr(), dtype=Int32),
                              cute.make_layout((4, c.n_stages * c.bn * 4), stride=(1, 4)))
        b4 = cute.make_tensor(cute.recast_ptr(st.sB.data_ptr(), dtype=Int32), cute.make_layout((4, 2 * c.bn * 8),
                                                                                                stride=(1, 4)))
        tab2 = cute.make_tensor(tab.iterator, cute.make_layout((2, WIDEN_TABLE_WORDS // 2), stride=(1, 2)))
        words = cute.make_rmem_tensor(cute.make_layout((4, steps), stride=(1, 4)), Int32)
        tabs = cute.make_rmem_tensor(cute.make_layout((2, steps), stride=(1, 2)), Int32)
        out = cute.make_rmem_tensor(cute.make_layout((4, 2), stride=(1, 4)), Int32)
        # every step's row is n0 + 32 step: one base per thread, the steps at constant offsets (n % 8 and the
        # sub-block j do not change with the step, so neither does the swizzle)
        n0 = half * rows + lt // SUBS
        j = lt % SUBS
        src0 = stage * (c.bn * 4) + n0 * SUBS + j
        dst0 = buf * (c.bn * 8) + n0 * 8
        dn = 128 // SUBS
        for step in cutlass.range_constexpr(steps):
            ti = (sSh[n0 + step * dn, 0, stage] >> (8 * j)) & 0xFF
            cute.autovec_copy(q4[None, src0 + step * 128], words[None, step])
            cute.autovec_copy(tab2[None, ti], tabs[None, step])
        for step in cutlass.range_constexpr(steps):
            for wi in cutlass.range_constexpr(4):
                lo, hi = widen8(words[wi, step], tabs[0, step], tabs[1, step])
                out[(wi % 2) * 2, wi // 2] = lo
                out[(wi % 2) * 2 + 1, wi // 2] = hi
            for h in cutlass.range_constexpr(2):
                cute.autovec_copy(out[None, h], b4[None, dst0 + step * (dn * 8) + ((2 * j + h) ^ (n0 % 8))])


class GroupedSplitRow(GroupedSplit):
    """v3 on row-frame weights (GroupedConfig.row_frame; expert_weights.prepare(frame="row")): col_scale is
    one value per weight row, equal in every K block, so a K block promotes with the row scales alone and
    the column scales multiply the accumulator once, in the tile's last K block."""

    @cute.jit
    def _kblock(self, ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, bar, g_rd, has_next, ctid):
        """K block g_rd: per wave 4 wgmma into tmp; the wave's 2 row scales read from the stage while they run
        (wave 0 also waits for and widens the next block's tile); wait; (last wave: free the stage);
        acc += tmp · row_scale; in the tile's last block (has_next false) then acc *= col_scale, the column
        scales read from the stage after tmp is dead and before the stage is freed. The closing barrier (the
        warpgroup's): its half of this block's B buffer is free and of the next one complete."""
        c = self.cfg
        W = c.waves
        state = self._stage(g_rd)
        n_r, n_c = cute.size(cC, mode=[0]), cute.size(cC, mode=[1])
        row_s = cute.make_rmem_tensor((n_r,), Float32)
        col_s = cute.make_rmem_tensor((n_c,), Float32)
        for w in cutlass.range_constexpr(W):
            fence_operand(tmp)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(mmas[0] if k == 0 else mmas[1], tmp, tCrA[(None, None, k, state.index * W + w)],
                          tCrB[(None, None, k, g_rd % 2)], tmp)
            warpgroup.commit_group()
            if cutlass.const_expr(w == 0):
                if has_next:
                    self._prepare(ring, st, sSh, tab, g_rd + 1, ctid)
            for r in cutlass.range_constexpr(n_r):
                row_s[r] = sSA[w * 64 + cC[r, 0][0], 0, state.index]
            warpgroup.wait_group(0)
            fence_operand(tmp)
            acc_mn, tmp_mn = mn_view(accs[w]), mn_view(tmp)
            if has_next:
                if cutlass.const_expr(w == W - 1):
                    ring.consumer_release(state)
                for r in cutlass.range_constexpr(n_r):
                    for cc in cutlass.range_constexpr(n_c):
                        acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * row_s[r]
            else:  # tmp dies before the column scales are loaded (acc + 32 scales, not acc + tmp + scales)
                for r in cutlass.range_constexpr(n_r):
                    for cc in cutlass.range_constexpr(n_c):
                        acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * row_s[r]
                for cc in cutlass.range_constexpr(n_c):
                    col_s[cc] = sSW[cC[0, cc][1], 0, state.index]
                for r in cutlass.range_constexpr(n_r):
                    for cc in cutlass.range_constexpr(n_c):
                        acc_mn[r, cc] = acc_mn[r, cc] * col_s[cc]
                if cutlass.const_expr(w == W - 1):
                    ring.consumer_release(state)
        bar.arrive_and_wait()


class GroupedL1Split(GroupedSplit):
    """Layer 1 (swiglu) of v3: named apart for the harness's per-kernel split."""


class GroupedL2Split(GroupedSplit):
    """Layer 2 (bf16) of v3."""


class GroupedL1Row(GroupedSplitRow):
    """Layer 1 of v3 on row-frame weights."""


class GroupedL2Row(GroupedSplitRow):
    """Layer 2 of v3 on row-frame weights."""


def split_kernel(cfg) -> GroupedSplit:
    if cfg.row_frame:
        return (GroupedL1Row if cfg.epilogue == "swiglu" else GroupedL2Row)(cfg)
    return (GroupedL1Split if cfg.epilogue == "swiglu" else GroupedL2Split)(cfg)
