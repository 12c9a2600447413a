"""SM90 grouped expert GEMM (DSV4 routed experts, issue #22): per expert e, y = x_e · W_e^T with x FP8
e4m3 (one fp32 scale per row and 128 of K, MN-major, as kernels/moe/dispatch.py writes it) and W in the
checkpoint's MXFP4 (kernels/moe/expert_weights.py: codes + load-time side data).

SM90 has no FP4 MMA. The FP4 bytes come from HBM by TMA (half of FP8's bytes: the decode floor) and
the consumer warpgroups widen them to e4m3 in shared memory (a `prmt` table lookup per 4 codes on the
3-bit magnitude, the sign bit copied; the table is chosen per 32-wide sub-block by its load-time shift),
then run SS wgmma on the widened tile (the widening: kernels/moe/grouped_widen.py). Widening in shared
memory rather than in registers (RS wgmma) keeps the x tile on the A side with the gemm family's mainloop,
its 64-row waves and its promotion; an RS kernel would put the weight on A (swap-AB) and the SwiGLU pairs
and the h quantisation block across warps. At decode a K block takes ~1.4 us a CTA whatever the load: the
CTA-wide chain widen -> fence -> barrier -> wgmma, not the weight stream (docs/perf/moe.md "v4 and wg4").

The widening of K block kb + 1 runs while kb's wgmmas do (two widened B buffers; GroupedConfig.overlap,
off in the variant `cutedsl:serial`). Per 128-K block: acc += tmp · sa[row] · col_scale[n] (col_scale = 2^(r − 127), the weight's
per-(row n, K block) reference exponent). Tile bm x 256: warpgroup 0 loads (one TMA warp), warpgroups
1-2 each own 128 columns (`kernels/moe/grouped_config.py`).

Layouts ((Mg, G) = rows per group and groups):
  masked (decode): G = E groups of Mg = max_m rows; `group` = counts [E]; only the m tiles holding a
      group's rows are work (rows past the count are neither stored nor read).
  contiguous (prefill): G = 1, Mg = layout rows; `group` = the expert of each row (-1: padding). With
      bm = 128 = the segment alignment the tiles whose first row is real are a prefix of the layout
      (segments fill from the front, the tail is padding): a binary search finds where it ends.
Epilogues (kernels/moe/grouped_epilogue.py): `swiglu` (layer 1: 256 interleaved gate/up columns = 128 intermediates -> bf16 gate / up
(the reference's w1 / w3 outputs), silu(min(g, 10)) · clamp(u, ±10) · route weight -> bf16 h -> e4m3
codes [rows, I] + one ue8m0 scale per row and 128 (MN-major [G, I/128, Mg], dispatch's rule)), `bf16`
(layer 2: bf16 rows [rows, D], the layout combine reads).
Persistent, with a compact work list (kernels/moe/grouped_work.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum

from kernels.gemm.tiling import KBLOCK
from kernels.moe.grouped_config import STAMP_CTAS, STAMP_SLOTS, STAMPS, WIDEN_TABLE_WORDS, WIDENER_WARPS, GroupedConfig
from kernels.moe.grouped_slices import split_plan
from kernels.moe.grouped_epilogue import GroupedEpilogues
from kernels.moe.grouped_ring import ring_atoms, ring_extent, ring_layouts, ring_partitions, ring_storage, tma_pieces
from kernels.moe.grouped_widen import GroupedWidening
from kernels.moe.grouped_work import GroupedWorkList
from kernels.regs import fence_operand, mn_view
from kernels.rings import consumer_state, tma_ring


def pdl_wait():
    """Programmatic dependent launch: wait for the previous kernel, then let the next one's CTAs take SMs as ours exit."""
    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()


class GroupedSm90(GroupedEpilogues, GroupedWidening, GroupedWorkList):
    def __init__(self, cfg: GroupedConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # x codes e4m3 (Mg, K, G), K contiguous
        mSA: cute.Tensor,  # x scales fp32 (Mg, K/128, G), Mg contiguous
        mB: cute.Tensor,  # weight codes uint8 (N, K/2, E), two e2m1 per byte; tiled_b: (bn, 64, E·NT·KB)
        mSh: cute.Tensor,  # widening table indices int32 (N, K/128, E), byte j: sub-block j
        mSW: cute.Tensor,  # weight column scales fp32 (N, K/128, E)
        mTab: cute.Tensor,  # widening tables int32 (40,)
        mGroup: cute.Tensor,  # masked: counts int32 (E,); contiguous: expert of each row int32 (rows,)
        mRowW: cute.Tensor,  # route weight of each row fp32 (G*Mg,) (swiglu only)
        mOut: cute.Tensor,  # swiglu: h codes uint8 (G*Mg, N/2); bf16: rows as int32 pairs (G*Mg, N/2)
        mOutS: cute.Tensor,  # swiglu: h scales fp32 (Mg, N/256, G), Mg contiguous; bf16: unused
        mWork: cute.Tensor,  # split_k: the units' fp32 partial tiles (cap x bn x bm), zeroed; else unused
        mCount: cute.Tensor,  # split_k: the slices in of each unit int32 (cap,), zeroed; else unused
        n_ctas: Int32,
        stream,
    ):
        c = self.cfg
        fp8 = mA.element_type
        tiled_mma, mma_acc, sA_layout, sB_layout = self._operands(fp8)
        sQ_layout, sSh_layout, sSW_layout, sSA_layout = ring_layouts(c)
        tma_a, gA_t = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                  cute.slice_(sA_layout, (None, None, 0)), (c.x_rows, KBLOCK))
        (tma_b, gB_t), (tma_sh, gSh_t), (tma_sw, gSW_t), (tma_sa, gSA_t) = ring_atoms(
            c, (mB, mSh, mSW, mSA), (sQ_layout, sSh_layout, sSW_layout, sSA_layout))

        Storage = ring_storage(c, fp8, sA_layout, (sQ_layout, sSh_layout, sSW_layout, sSA_layout), sB_layout)
        units = cute.size(mA, mode=[2]) * ((cute.size(mA, mode=[0]) + c.bm - 1) // c.bm) * (
            (cute.size(mSh, mode=[0]) + c.bn - 1) // c.bn)
        self.kernel(tma_a, gA_t, tma_b, gB_t, tma_sh, gSh_t, tma_sw, gSW_t, tma_sa, gSA_t, mTab, mGroup, mRowW,
                    mOut, mOutS, mWork, mCount, tiled_mma, mma_acc, sA_layout, sB_layout, sQ_layout, sSh_layout,
                    sSW_layout,
                    sSA_layout, Storage).launch(grid=(cutlass.min(units, n_ctas), 1, 1), block=[c.threads, 1, 1],
                                                min_blocks_per_mp=1, stream=stream, use_pdl=c.pdl)

    def _operands(self, fp8) -> tuple:
        """(the first K step's MMA, the accumulating one, x's stage buffers, the widened B tiles): SS wgmma over
        two warpgroups of bn / 2 columns, x in 64-row waves (A), two widened weight tiles (B). v5 overrides it."""
        c = self.cfg
        tile = (64, c.bn, KBLOCK)
        mma = lambda: sm90_utils.make_trivial_tiled_mma(  # noqa: E731
            fp8, fp8, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32, (1, 2, 1), (64, c.bn // 2))
        return (mma(), mma(), sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, fp8, c.n_stages * c.waves),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, fp8, c.widen_buffers))

    @cute.kernel
    def kernel(self, tma_a, gA_t, tma_b, gB_t, tma_sh, gSh_t, tma_sw, gSW_t, tma_sa, gSA_t, mTab, mGroup, mRowW,
               mOut, mOutS, mWork, mCount, tiled_mma, mma_acc, sA_layout, sB_layout, sQ_layout, sSh_layout, sSW_layout,
               sSA_layout, Storage: cutlass.Constexpr):
        c = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        if tidx == 0:
            self._stamp(mWork, bidx, "entry")
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        if warp_idx == 0:
            for atom in (tma_a, tma_b, tma_sh, tma_sw, tma_sa):
                cpasync.prefetch_descriptor(atom)

        st = cutlass.utils.SmemAllocator().allocate(Storage)
        ring = tma_ring(st.bars.data_ptr(), c.n_stages, c.n_mma_wg * 4, c.stage_bytes)
        if cutlass.const_expr(c.widen_wg):  # v19: the B buffers' full (the wideners' threads), empty (consumer warps)
            if tidx == 0:
                for b in cutlass.range_constexpr(c.widen_buffers):
                    cute.arch.mbarrier_init(st.wbars.data_ptr() + b, WIDENER_WARPS * (1 if c.warp_handover else 32))
                    cute.arch.mbarrier_init(st.wbars.data_ptr() + c.widen_buffers + b, c.n_mma_wg * 4)
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = None  # v5: no widened tiles
        if cutlass.const_expr(sB_layout is not None):
            sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sQ = (st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner) if cutlass.const_expr(c.rs_codes)
              else st.sQ.get_tensor(sQ_layout))
        sSh = st.sSh.get_tensor(sSh_layout)
        sSW = st.sSW.get_tensor(sSW_layout)
        sSA = st.sSA.get_tensor(sSA_layout)

        # (x_rows, 128, Mg/x_rows, KB, G): x's 64-row waves (v5: bm-row tiles); the ring's other four
        a = tma_pieces(tma_a, gA_t, sA, (c.x_rows, KBLOCK))
        b, sh, sw, sa = ring_partitions(c, ((tma_b, gB_t), (tma_sh, gSh_t), (tma_sw, gSW_t), (tma_sa, gSA_t)),
                                        (sQ, sSh, sSW, sSA))
        mg = cute.size(gA_t, mode=[0])
        tiles_m = (mg + c.bm - 1) // c.bm
        tiles_n, n_kb = ring_extent(c, gSh_t)
        n_groups = cute.size(gA_t, mode=[2])

        pipeline_init_wait(cluster_shape_mn=(1, 1))
        if cutlass.const_expr(c.pdl and not c.early_weights):  # the set-up above overlapped the previous kernel's tail
            pdl_wait()  # before the first global access (counts, x, h, outputs)
        units = self._work(st, mGroup, n_groups, tiles_m, mg, tidx) * tiles_n
        if tidx == 0:
            self._stamp(mWork, bidx, "work")
        full, slices = units, Int32(1)  # split_k: units run whole, slices of each tail unit (grouped_slices)
        if cutlass.const_expr(c.split_k > 1):
            cap = cute.size(mCount)  # tail units the workspace holds: v5's tiles fit its slots (bn x 32 tokens)
            if cutlass.const_expr(not c.swap_ab):  # v3's 64-row tile (v15): half as many
                cap = cutlass.min(cap, cute.size(mWork) // (c.bn * c.bm))
            full, slices = split_plan(units, gdim, n_kb, cap, c.split_k)
        if cutlass.const_expr(c.early_weights):  # the TMA warp waits after its first weight tiles (_produce)
            if warp_idx != 0:
                pdl_wait()
        if wg == 0:
            cute.arch.setmaxregister_decrease(c.producer_regs)
            if warp_idx == 0:
                self._produce(ring, a, b, sh, sw, sa, units, tiles_n, n_kb, n_groups, mg, mGroup, st, bidx, gdim,
                              (full, slices), mWork)
            if cutlass.const_expr(c.widen_wg):  # v19 (grouped_split._widen_loop)
                if (warp_idx >= 1) & (warp_idx <= WIDENER_WARPS):
                    self._widen_loop(ring, st, sSh, mTab, units, n_kb, bidx, gdim, tidx - 32)
        else:
            cute.arch.setmaxregister_increase(c.consumer_regs)
            self._consume(ring, tiled_mma, mma_acc, sA, sB, sSh, sSW, sSA, st, mTab, mGroup, mRowW, mOut, mOutS,
                          n_groups, tiles_n, n_kb, units, mg, bidx, gdim, tidx - 128, (mWork, mCount, full, slices))

    @cute.jit
    def _stamp(self, mWork, bidx, name: cutlass.Constexpr):
        """GroupedConfig.stamps: this CTA's stamp `name` (grouped_config.STAMPS) <- globaltimer_lo, in L1's or L2's
        region of layer.stamp_workspace; the caller picks the one thread. Nothing without stamps."""
        if cutlass.const_expr(self.cfg.stamps):
            region = STAMP_CTAS * STAMP_SLOTS * int(self.cfg.epilogue == "bf16")
            slots = cute.recast_tensor(mWork, Int32)
            slots[region + bidx * STAMP_SLOTS + STAMPS.index(name)] = cute.arch.globaltimer_lo()

    @cute.jit
    def _produce(self, ring, a, b, sh, sw, sa, units, tiles_n, n_kb, n_groups, mg, mGroup, st, bidx, gdim, plan,
                 mWork):
        """The TMA warp (v2, v4 and v5's GroupedRs): per unit and K block one stage of x (`a_boxes` boxes: v2's
        64-row waves, v5's one bm-row tile), the FP4 weight tile (tiled: one contiguous tile of the load-time
        layout), its shift words and column scales, x's row scales. Each argument a (atom, global, shared).
        split_k: per item (a whole unit, or a tail unit's K slice: grouped_slices.item_range) its K blocks."""
        c = self.cfg
        boxes = c.a_boxes
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, c.n_stages)
        full, slices = plan
        items = full + (units - full) * slices
        early = Int32(0)  # early_weights: the first item's first K blocks whose stages and weights went before the wait
        if cutlass.const_expr(c.early_weights):
            pre = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, c.n_stages)
            if bidx < items:
                u, kb0, kb1, _slot = self._item(bidx, plan, n_kb)
                _g, _mt, nt, e, _limit = self._unit(u, tiles_n, n_groups, mg, mGroup, st)
                early = cutlass.min(kb1 - kb0, c.n_stages)
                for kb in cutlass.range(kb0, kb0 + early, unroll=1):
                    ring.producer_acquire(pre)
                    self._load_weights(b, sh, sw, tiles_n, n_kb, nt, kb, e, pre.index, ring.producer_get_barrier(pre))
                    pre.advance()
            pdl_wait()
        n = Int32(0)
        for w in cutlass.range(bidx, items, gdim, unroll=1):
            u, kb0, kb1, _slot = self._item(w, plan, n_kb)
            g, mt, nt, e, _limit = self._unit(u, tiles_n, n_groups, mg, mGroup, st)
            for kb in cutlass.range(kb0, kb1, unroll=1):
                fresh = True  # the stage is not one the early pass took
                if cutlass.const_expr(c.early_weights):
                    fresh = n >= early
                    n += 1
                if fresh:
                    ring.producer_acquire(state)
                bar = ring.producer_get_barrier(state)
                for box in cutlass.range_constexpr(boxes):
                    cute.copy(a[0], a[1][(None, mt * boxes + box, kb, g)], a[2][(None, state.index * boxes + box)],
                              tma_bar_ptr=bar)
                if fresh:
                    self._load_weights(b, sh, sw, tiles_n, n_kb, nt, kb, e, state.index, bar)
                cute.copy(sa[0], sa[1][(None, mt, kb, g)], sa[2][(None, state.index)], tma_bar_ptr=bar)
                ring.producer_commit(state)
                state.advance()
                if cutlass.const_expr(c.stamps):
                    if (w == bidx) & (kb == kb0):
                        self._stamp(mWork, bidx, "issued")
        ring.producer_tail(state)

    @cute.jit
    def _load_weights(self, b, sh, sw, tiles_n, n_kb, nt, kb, e, index, bar):
        """The weight side of a stage: the FP4 tile (tiled: one contiguous tile of the load-time layout), its shift
        words and column scales: with `row_scale_once`, K block 0's (the row frame's are the same in every block), so
        DRAM gives them once a unit and the L2 the rest."""
        kb_sw = 0 if cutlass.const_expr(self.cfg.row_scale_once) else kb
        if cutlass.const_expr(self.cfg.tiled_codes):
            codes = b[1][(None, 0, 0, (e * tiles_n + nt) * n_kb + kb)]
        else:
            codes = b[1][(None, nt, kb, e)]
        cute.copy(b[0], codes, b[2][(None, index)], tma_bar_ptr=bar)
        cute.copy(sh[0], sh[1][(None, nt, kb, e)], sh[2][(None, index)], tma_bar_ptr=bar)
        cute.copy(sw[0], sw[1][(None, nt, kb_sw, e)], sw[2][(None, index)], tma_bar_ptr=bar)

    @cute.jit
    def _consume(self, ring, tiled_mma, mma_acc, sA, sB, sSh, sSW, sSA, st, mTab, mGroup, mRowW, mOut, mOutS,
                 n_groups, tiles_n, n_kb, units, mg, bidx, gdim, ctid, _split):
        c = self.cfg
        tab, tCrA, tCrB, accs, tmp, cC = self._consumer_state(tiled_mma, sA, sB, st, mTab, ctid)
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)
        bar.arrive_and_wait()  # the table is in
        g_rd = Int32(0)
        for u in cutlass.range(bidx, units, gdim, unroll=1):
            g, mt, nt, e, limit = self._start_tile(u, accs, tiles_n, n_groups, mg, mGroup, st)
            if cutlass.const_expr(c.overlap):
                self._prepare(ring, st, sSh, tab, g_rd, ctid)
                bar.arrive_and_wait()
            for kb in cutlass.range(0, n_kb, unroll=1):
                if cutlass.const_expr(not c.overlap):
                    self._prepare(ring, st, sSh, tab, g_rd, ctid)
                    bar.arrive_and_wait()
                self._kblock(ring, (tiled_mma, mma_acc), tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, bar,
                             g_rd, kb + 1 < n_kb, ctid, limit - mt * c.bm)
                g_rd = g_rd + 1
            self._store_tile(accs, cC, st, bar, mRowW, mOut, mOutS, g, mt, nt, limit, mg, ctid)

    @cute.jit
    def _consumer_state(self, tiled_mma, sA, sB, st, mTab, ctid):
        """A consumer thread's set-up (v2 and v3 alike): the widening table copied into shared memory (the
        caller's barrier publishes it), the thread's wgmma fragments of the A and B buffers, one accumulator
        per wave, the wgmma's partial `tmp` and the (row, column) of each accumulator value."""
        c = self.cfg
        tab = st.tab.get_tensor(cute.make_layout((WIDEN_TABLE_WORDS,)))
        if cutlass.const_expr(not c.widen_wg):  # v19: the wideners copy it (`_widen_loop`)
            if ctid < WIDEN_TABLE_WORDS:
                tab[ctid] = mTab[ctid]
        thr_mma = tiled_mma.get_slice(ctid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_shape_C((64, c.bn))
        accs = [cute.make_rmem_tensor(acc_shape, Float32) for _ in range(c.waves)]
        tmp = cute.make_rmem_tensor(acc_shape, Float32)
        cC = mn_view(thr_mma.partition_C(cute.make_identity_tensor((64, c.bn))))
        return tab, tCrA, tCrB, accs, tmp, cC

    @cute.jit
    def _start_tile(self, u, accs, tiles_n, n_groups, mg, mGroup, st):
        """Unit u's tile (`_unit`), its accumulators zeroed."""
        g, mt, nt, e, limit = self._unit(u, tiles_n, n_groups, mg, mGroup, st)
        for w in cutlass.range_constexpr(self.cfg.waves):
            accs[w].fill(0.0)
        return g, mt, nt, e, limit

    @cute.jit
    def _stage(self, g_rd):
        """The ring state of K block g_rd; a power-of-two ring's by masks (rings.consumer_state): with them v5's
        index and phase and the wgmma descriptors built from them stay in uniform registers, where the signed
        division's result took R2UR moves before each wgmma (H200: 1.10-1.16x at decode, docs/perf/moe.md v10)."""
        n = self.cfg.n_stages
        return consumer_state(n, g_rd, masks=(n & (n - 1)) == 0)

    def _buffer(self, g):
        """(widened B buffer, its full barrier's phase) of K block g."""
        nb = self.cfg.widen_buffers
        return g % nb, (g // nb) & 1

    @cute.jit
    def _prepare(self, ring, st, sSh, tab, g_rd, ctid):
        """Wait for K block g_rd's stage and widen its FP4 tile (`_widen_stage`) into its B buffer (`_buffer`), fenced
        for the wgmma (async proxy); the caller's barrier publishes it to the warpgroups that read it."""
        state = self._stage(g_rd)
        ring.consumer_wait(state)
        if cutlass.const_expr(self.cfg.ablate != "no-widen"):
            self._widen_stage(st, sSh, tab, state.index, self._buffer(g_rd)[0], ctid)
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def _kblock(self, ring, mmas, tCrA, tCrB, accs, tmp, cC, st, sSh, sSW, sSA, tab, bar, g_rd, has_next, ctid,
                live_rows):
        """K block g_rd, its tile widened and published: per wave 4 wgmma into tmp, wait, (last wave: free
        the stage), promote with the stage's scales. `overlap`: the next block's stage is waited for and
        widened into the other B buffer while wave 0's wgmmas run. `skip_idle_warps`: a warp whose 16
        accumulator rows of the wave are all at or past `live_rows` (the tile's real rows) neither loads the
        scales nor promotes (its rows are never stored); it still waits and frees the stage. The closing
        barrier: every thread is done with this block's B buffer and the next one is complete."""
        c = self.cfg
        W = c.waves
        state = self._stage(g_rd)
        n_r, n_c = cute.size(cC, mode=[0]), cute.size(cC, mode=[1])
        col_s = cute.make_rmem_tensor((n_c,), Float32)
        row_s = cute.make_rmem_tensor((W, n_r), Float32)
        prod = cute.make_rmem_tensor((n_r, n_c), Float32)
        early = c.early_scales and W == 1
        if cutlass.const_expr(c.skip_idle_warps):
            warp_row = cute.arch.make_warp_uniform((ctid % 128) // 32) * 16  # the warp's first accumulator row
        for w in cutlass.range_constexpr(W):
            self._issue_wave(mmas, tCrA, tCrB, tmp, state, g_rd, w)
            if cutlass.const_expr(c.overlap and w == 0):
                if has_next:
                    self._prepare(ring, st, sSh, tab, g_rd + 1, ctid)
            if cutlass.const_expr(c.skip_idle_warps):  # scales read after the wait, by live warps only
                warpgroup.wait_group(0)
                fence_operand(tmp)
                if w * 64 + warp_row < live_rows:
                    self._scales(col_s, row_s, cC, sSW, sSA, state.index)  # (only wave w's row scales used)
                    self._promote(accs[w], tmp, col_s, row_s, w)
                if w == W - 1:
                    ring.consumer_release(state)
            else:
                if cutlass.const_expr(early):  # decode: scales and their products while the wgmmas run
                    self._scales(col_s, row_s, cC, sSW, sSA, state.index)
                    for r in cutlass.range_constexpr(n_r):
                        for cc in cutlass.range_constexpr(n_c):
                            prod[r, cc] = row_s[0, r] * col_s[cc]
                warpgroup.wait_group(0)
                if cutlass.const_expr(not early):
                    if w == 0:  # the promotion scales of every wave, from the stage (still held)
                        self._scales(col_s, row_s, cC, sSW, sSA, state.index)
                if w == W - 1:
                    ring.consumer_release(state)
                fence_operand(tmp)
                if cutlass.const_expr(early):
                    acc_mn, tmp_mn = mn_view(accs[w]), mn_view(tmp)
                    for r in cutlass.range_constexpr(n_r):
                        for cc in cutlass.range_constexpr(n_c):
                            acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * prod[r, cc]
                else:
                    self._promote(accs[w], tmp, col_s, row_s, w)
        bar.arrive_and_wait()

    @cute.jit
    def _promote(self, acc, tmp, col_s, row_s, w: cutlass.Constexpr):
        """acc += tmp · sa[row] · col_scale[n], the scales read after the wait (v2 at prefill, v4's live warps)."""
        acc_mn, tmp_mn = mn_view(acc), mn_view(tmp)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            for cc in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * (row_s[w, r] * col_s[cc])

    @cute.jit
    def _issue_wave(self, mmas, tCrA, tCrB, tmp, state, g_rd, w):
        """Wave w's 4 wgmma of K block g_rd (the stage's A tile, B buffer g_rd % widen_buffers) into tmp, one committed
        group."""
        W = self.cfg.waves
        fence_operand(tmp)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mmas[0] if k == 0 else mmas[1], tmp, tCrA[(None, None, k, state.index * W + w)],
                      tCrB[(None, None, k, self._buffer(g_rd)[0])], tmp)
        warpgroup.commit_group()

    @cute.jit
    def _scales(self, col_s, row_s, cC, sSW, sSA, stage):
        """The promotion scales of the stage's K block: the thread's weight columns and every wave's x rows."""
        for cc in cutlass.range_constexpr(cute.size(cC, mode=[1])):
            col_s[cc] = sSW[cC[0, cc][1], 0, stage]
        for ww in cutlass.range_constexpr(self.cfg.waves):
            for r in cutlass.range_constexpr(cute.size(cC, mode=[0])):
                row_s[ww, r] = sSA[ww * 64 + cC[r, 0][0], 0, stage]

class GroupedL1(GroupedSm90):
    """Layer 1 (swiglu epilogue): its own class so the profiler's kernel name (built from the instance)
    tells L1 from L2 in the harness's per-kernel split."""


class GroupedL2(GroupedSm90):
    """Layer 2 (bf16 epilogue): see GroupedL1."""


def grouped_kernel(cfg: GroupedConfig) -> GroupedSm90:
    if cfg.split_wg:  # v3 (prefill): its own classes, this module's code path untouched
        from kernels.moe.grouped_split import split_kernel
        return split_kernel(cfg)
    if cfg.swap_ab:  # v5 (decode): RS wgmma with the weights as A
        from kernels.moe.grouped_rs import GroupedL1Rs, GroupedL2Rs
        return (GroupedL1Rs if cfg.epilogue == "swiglu" else GroupedL2Rs)(cfg)
    return (GroupedL1 if cfg.epilogue == "swiglu" else GroupedL2)(cfg)
