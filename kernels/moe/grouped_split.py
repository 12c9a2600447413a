"""v3 (prefill) of the grouped expert GEMM: the two consumer warpgroups decoupled (GroupedConfig.split_wg,
variant `cutedsl:split-wg`; docs/perf/moe.md "v3").

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
(`GroupedSplit` overrides `_consume` and `_widen_stage`; the rest, and the pieces of those two that v2 has too,
are grouped_sm90's, grouped_widen's and grouped_epilogue's).

The L1 epilogue's amax exchange buffer (`red`, one slot per (row, warpgroup, wave)) is written before and read
after a 256-thread barrier. With one wave (bm 64) a warpgroup free to drift could write the next tile's slot
while the other still reads this tile's: a closing 256-thread barrier after each L1 tile orders them. With two
waves (prefill) the barriers of the waves already do: the next tile's wave-0 write comes after this tile's
wave-1 barrier (every wave-0 read is before it), its wave-1 write after the next tile's wave-0 barrier.

v19 (GroupedConfig.widen_wg; v23 three B buffers; v24, the prefill pick, one hand-over arrive a warp): the consumers
widen nothing; warps 1-3 of the producer warpgroup widen each stage's whole tile into the B buffers (`_widen_loop`),
handed over by full / empty mbarriers instead of the barriers.

`GroupedSplitRow` (row_frame) overrides `_kblock`: the promotion with row scales alone (weights prepared in the
row frame, kernels/moe/expert_weights.prepare). `fast_silu` (L1's silu by rcp.approx and 2-byte h stores) is
a mode of the shared epilogue (kernels/moe/grouped_epilogue.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from kernels.gemm.tiling import KBLOCK
from kernels.moe.grouped_config import WIDEN_TABLE_WORDS, WIDENER_WARPS
from kernels.moe.grouped_sm90 import GroupedSm90
from kernels.moe.grouped_widen import SUBS, pair_offset, table_pair, widen_item, widen_item_rs
from kernels.regs import fence_operand, mn_view

WG_BARRIER = 2  # named barrier ids 2 and 3: one per consumer warpgroup (1: the 256-thread one; 0: the CTA's)
WIDENER_BARRIER = 4  # v19: the widener warps' (their table copy)


class GroupedSplit(GroupedSm90):
    @cute.jit
    def _consume(self, ring, tiled_mma, mma_acc, sA, sB, sSh, sSW, sSA, st, mTab, mGroup, mRowW, mOut, mOutS,
                 n_groups, tiles_n, n_kb, units, mg, bidx, gdim, ctid, split):
        """Per item (a unit, or with split_k a tail unit's K slice: the one-wave masked tile, v15) its K blocks, then
        the tile's epilogue (a slice: its partial into the workspace first, and only the last slice in stores;
        kernels/split_merge.add_and_count)."""
        c = self.cfg
        tab, tCrA, tCrB, accs, tmp, cC = self._consumer_state(tiled_mma, sA, sB, st, mTab, ctid)
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)  # both warpgroups
        half = cute.arch.make_warp_uniform(ctid // 128)
        wg_bar = pipeline.NamedBarrier(barrier_id=WG_BARRIER + half, num_threads=128)  # this warpgroup
        bar.arrive_and_wait()  # the table is in
        _work, _count, full, slices = split
        g_rd = Int32(0)
        for w in cutlass.range(bidx, full + (units - full) * slices, gdim, unroll=1):
            u, kb0, kb1, slot = self._item(w, (full, slices), n_kb)  # split_k: a tail unit's K slice (grouped_slices)
            g, mt, nt, e, limit = self._start_tile(u, accs, tiles_n, n_groups, mg, mGroup, st)
            if cutlass.const_expr(not c.widen_wg):  # v19: each K block waits for its widened tile (`_await_widened`)
                self._prepare(ring, st, sSh, tab, g_rd, ctid)
                wg_bar.arrive_and_wait()
            live = limit - mt * c.bm
            if cutlass.const_expr(c.skip_padding_wave):  # contiguous: rows 64.. padding iff row 64 is
                live = cutlass.select_(mGroup[mt * c.bm + 64] >= 0, c.bm, 64)
            for kb in cutlass.range(kb0, kb1, unroll=1):  # a slice's last block applies the (linear) column scales
                self._kblock(ring, (tiled_mma, mma_acc), tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, wg_bar,
                             g_rd, kb + 1 < kb1, ctid, live)
                g_rd = g_rd + 1
            if cutlass.const_expr(c.split_k > 1):
                if self._holds_sum(accs, split, st, bar, w, slot, ctid):
                    self._store_tile(accs, cC, st, bar, mRowW, mOut, mOutS, g, mt, nt, limit, mg, ctid)
            else:
                self._store_tile(accs, cC, st, bar, mRowW, mOut, mOutS, g, mt, nt, limit, mg, ctid)
            if cutlass.const_expr(c.epilogue == "swiglu" and c.waves == 1):
                bar.arrive_and_wait()  # every read of `red` for this tile is done before the next tile's writes

    @cute.jit
    def _widen_stage(self, st, sSh, tab, stage, buf, ctid):
        """v2's widening (GroupedWidening's: the loads first, `widen_item`, two 16-byte swizzled stores an item) over the
        warpgroup's rows only, into its half of the B buffer: item i of warpgroup h is row 128 h + i / 4,
        sub-block i % 4 (a quarter-warp's 8 stores still cover rows n, n + 1, all 32 banks)."""
        c = self.cfg
        rows = c.bn // c.n_mma_wg
        self._widen_rows(st, sSh, tab, stage, buf, (ctid // 128) * rows, ctid % 128, 128, rows, rows * SUBS // 128)

    @cute.jit
    def _widen_rows(self, st, sSh, tab, stage, buf, row0, t, threads: cutlass.Constexpr, rows: cutlass.Constexpr,
                    batch: cutlass.Constexpr):
        """Rows [row0, row0 + rows) of the stage's FP4 tile widened into B buffer `buf` by `threads` threads (v3: a
        warpgroup its half; v19: the widener warps the whole tile): thread t's items are rows row0 + t / 4 + i · dn (dn =
        threads / 4, a multiple of 8: n % 8, the sub-block t % 4 and so the swizzle are the same in every item; rows past
        the range skipped), `batch` items' loads at a time, then their widening and stores."""
        c = self.cfg
        dn = threads // SUBS
        steps = -(-rows * SUBS // threads)  # the last one partial where the threads do not divide the items
        q4, b4, words, tabs, out = self._widen_views(st, batch)
        n0 = row0 + t // SUBS
        j = t % SUBS
        src0 = stage * (c.bn * 4) + n0 * SUBS + j
        dst0 = buf * (c.bn * 8) + n0 * 8
        for b0 in cutlass.range_constexpr(0, steps, batch):
            todo = range(b0, min(b0 + batch, steps))
            for i in cutlass.range_constexpr(len(todo)):
                step = todo[i]
                n = n0 + step * dn
                if cutlass.const_expr((step + 1) * dn <= rows) or n < row0 + rows:
                    if cutlass.const_expr(c.rs_codes):
                        self._load_rs_item(st, stage, n, j, words, i)
                    else:
                        cute.autovec_copy(q4[None, src0 + step * 128], words[None, i])
                    cute.autovec_copy(table_pair(tab, pair_offset(sSh[n, 0, stage], j)), tabs[None, i])
            for i in cutlass.range_constexpr(len(todo)):
                step = todo[i]
                if cutlass.const_expr((step + 1) * dn <= rows) or n0 + step * dn < row0 + rows:
                    if cutlass.const_expr(c.rs_codes):
                        widen_item_rs(words, tabs, i, out)
                    else:
                        widen_item(words, tabs, i, out)
                    for h in cutlass.range_constexpr(2):
                        cute.autovec_copy(out[None, h], b4[None, dst0 + step * (dn * 8) + ((2 * j + h) ^ (n0 % 8))])

    @cute.jit
    def _widen_loop(self, ring, st, sSh, mTab, units, n_kb, bidx, gdim, wtid):
        """v19 (GroupedConfig.widen_wg): the widener warps (wtid 0 .. 32 WIDENER_WARPS - 1 of the producer warpgroup)
        walk the CTA's K blocks (its units' n_kb each, in the consumers' order); per block g: wait for its stage (TMA)
        and for B buffer g % nb to be free (nb widen_buffers: every consumer warp done with block g - nb), widen the
        whole tile into it (`_widen_rows`), fence for the async proxy, arrive on the buffer's full barrier. They hold
        the widening table (the consumers do not)."""
        c = self.cfg
        threads = 32 * WIDENER_WARPS
        tab = st.tab.get_tensor(cute.make_layout((WIDEN_TABLE_WORDS,)))
        if wtid < WIDEN_TABLE_WORDS:
            tab[wtid] = mTab[wtid]
        pipeline.NamedBarrier(barrier_id=WIDENER_BARRIER, num_threads=threads).arrive_and_wait()
        wb = st.wbars.data_ptr()
        blocks = cutlass.select_(bidx < units, (units - bidx + gdim - 1) // gdim, 0) * n_kb
        for g in cutlass.range(0, blocks, unroll=1):
            state = self._stage(g)
            buf, phase = self._buffer(g)
            ring.consumer_wait(state)
            cute.arch.mbarrier_wait(wb + c.widen_buffers + buf, phase ^ 1)  # empty: the other phase
            if cutlass.const_expr(not c.skips_widen):  # the knock-out: the hand-over alone
                rows = c.bn // 2 if c.ablate == "half-widen" else c.bn  # the knock-out: rows 0-127
                self._widen_rows(st, sSh, tab, state.index, buf, 0, wtid, threads, rows, c.widen_batch)
            cute.arch.fence_proxy("async.shared", space="cta")
            if cutlass.const_expr(c.warp_handover):  # v24: one arrive a warp, after its lanes' stores and fences
                cute.arch.sync_warp()
                if cute.arch.lane_idx() == 0:
                    cute.arch.mbarrier_arrive(wb + buf)
            else:
                cute.arch.mbarrier_arrive(wb + buf)

    @cute.jit
    def _await_widened(self, ring, st, state, g_rd):
        """v19: K block g_rd's stage `state` (x, scales) and its widened tile (the wideners' full barrier) are in."""
        ring.consumer_wait(state)
        buf, phase = self._buffer(g_rd)
        cute.arch.mbarrier_wait(st.wbars.data_ptr() + buf, phase)

    @cute.jit
    def _load_rs_item(self, st, stage, n, j, words, step):
        """Item (row n, sub-block j) from RS-ordered codes (GroupedConfig.rs_codes): its word q is word j of the row's
        16-byte chunk q, which the stage's 64B swizzle put at chunk q ^ ((n >> 1) & 3). A quarter-warp's 8 loads (rows
        n, n + 1, sub-blocks 0-3) and the warp's 4 row pairs land in 32 distinct banks."""
        c = self.cfg
        q32 = cute.make_tensor(cute.recast_ptr(st.sQ.data_ptr(), dtype=Int32),
                               cute.make_layout((c.n_stages * c.bn * KBLOCK // 8,)))
        base = stage * (c.bn * KBLOCK // 8) + n * (KBLOCK // 8) + j
        for q in cutlass.range_constexpr(4):
            words[q, step] = q32[base + 4 * (q ^ ((n >> 1) & 3))]


class GroupedSplitRow(GroupedSplit):
    """v3 on row-frame weights (GroupedConfig.row_frame; expert_weights.prepare(frame="row")): col_scale is
    one value per weight row, equal in every K block, so a K block promotes with the row scales alone and
    the column scales multiply the accumulator once, in the tile's last K block."""

    @cute.jit
    def _kblock(self, ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, bar, g_rd, has_next, ctid,
                live_rows):
        """K block g_rd (`live_rows` unused: v3 promotes every warp's rows): per wave 4 wgmma into tmp; the
        wave's 2 row scales read from the stage while they run (wave 0 also waits for and widens the next
        block's tile); wait; (last wave: free the stage);
        acc += tmp · row_scale; in the tile's last block (has_next false) then acc *= col_scale, the column
        scales read from the stage after tmp is dead and before the stage is freed. The closing barrier (the
        warpgroup's): its half of this block's B buffer is free and of the next one complete."""
        c = self.cfg
        W = c.waves
        state = self._stage(g_rd)
        if cutlass.const_expr(c.widen_wg):
            self._await_widened(ring, st, state, g_rd)
        for w in cutlass.range_constexpr(W):
            if cutlass.const_expr(c.skip_padding_wave and w == W - 1):
                if live_rows > 64 * w:  # the last wave holds a real row (a tile-uniform branch)
                    self._row_wave(ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, state, g_rd,
                                   has_next, ctid, w, True)
            else:
                last = w == W - 1
                if cutlass.const_expr(c.skip_padding_wave):
                    last = live_rows <= 64 * (w + 1)  # the waves after this one are skipped: free the stage here
                self._row_wave(ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, state, g_rd, has_next,
                               ctid, w, last)
        if cutlass.const_expr(not c.widen_wg):
            bar.arrive_and_wait()

    @cute.jit
    def _row_wave(self, ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, state, g_rd, has_next, ctid,
                  w: cutlass.Constexpr, release):
        """Wave w of K block g_rd: 4 wgmma into tmp; its 2 row scales read while they run (wave 0 also waits for
        and widens the next block's tile); wait; acc += tmp · row_scale; in the tile's last block then acc *=
        col_scale (read from the stage after tmp is dead); `release`: this wave is the block's last, free the stage."""
        n_r, n_c = cute.size(cC, mode=[0]), cute.size(cC, mode=[1])
        row_s = cute.make_rmem_tensor((n_r,), Float32)
        col_s = cute.make_rmem_tensor((n_c,), Float32)
        self._issue_wave(mmas, tCrA, tCrB, tmp, state, g_rd, w)
        if cutlass.const_expr(w == 0 and not self.cfg.widen_wg):
            if has_next:
                self._prepare(ring, st, sSh, tab, g_rd + 1, ctid)
        for r in cutlass.range_constexpr(n_r):
            row_s[r] = sSA[w * 64 + cC[r, 0][0], 0, state.index]
        warpgroup.wait_group(0)
        fence_operand(tmp)
        acc_mn, tmp_mn = mn_view(accs[w]), mn_view(tmp)
        if has_next:
            if release:
                self._release(ring, st, state, g_rd)
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
            if release:
                self._release(ring, st, state, g_rd)

    @cute.jit
    def _release(self, ring, st, state, g_rd):
        """The block's last wave is done: free its stage (and, v19, its B buffer: one arrive a consumer warp)."""
        ring.consumer_release(state)
        if cutlass.const_expr(self.cfg.widen_wg):
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(st.wbars.data_ptr() + self.cfg.widen_buffers + self._buffer(g_rd)[0])


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
