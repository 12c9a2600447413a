"""SM90 FP8 block-scaled GEMM (DSV4 linear layers): y[M, N] = x[M, K] . W[N, K]^T, bf16 out.

Recipe (docs/model-math.md §2.3 / §2.6, the reference's fp8_gemm): x and W are FP8 e4m3, K-major. The
activation carries one fp32 scale per (row, 128 columns of K) (`sa` [M, K/128]); the weight one per
128 x 128 block (`sw` [ceil(N/128), K/128]). For every 128-wide K block a warpgroup runs its wgmmas
into a temporary fp32 accumulator (tensor-core accumulation stays inside one block), then promotes:
acc += tmp * (sa[row, kb] * sw[n_blk, kb]).

Grouped mode (the output projection wo_a, spec §7.4): y[:, g*Ng:(g+1)*Ng] = x[:, g*K:(g+1)*K] .
W[g*Ng:(g+1)*Ng, :]^T for G groups in one launch. x is [M, G*K], W [G*Ng, K], y [M, G*Ng]; a tile's
group follows from its first output column, and only its A loads (and activation scales) move by
g*K. `n_group` = N makes the plain GEMM.

Structure (one CTA per SM, persistent):
  * warpgroup 0: warp 0 issues the TMA loads of the (bm x 128) x tile and (bn x 128) W tile of each
    K block into a `stages`-deep ring (PipelineTmaAsync: full barrier with transaction bytes,
    empty barrier with one arrive per consumer warp). Rows past M or N are zero-filled by TMA.
  * consumer warpgroups (1 for bm = 64, 2 otherwise): the tile's rows go in `waves` of
    wave_m = 64 * warpgroups rows (bm = 256: two waves); per K block and wave, each warpgroup issues
    4 wgmma (m64 n{bn} k32) into `tmp`, waits for them and promotes into that wave's accumulator
    (one wave: K blocks chained, block j + 1 issued before j is promoted, `chain`). The stage is freed after
    the last wave's wgmmas. The scales ride in the stage too (TMA boxes of sa and sw, see below)
    and are read from shared memory before the wgmmas are issued: a global load (ld.global or
    cp.async) in flight at a wgmma fence stalls it for the whole L2 latency, every K block.
  * epilogue: per wave, acc -> bf16 -> shared memory (stmatrix) -> TMA store in (wave_m x 32)
    slices; TMA clips rows / columns past M / N, so ragged shapes need no padding copies.
  * tiles are handed out statically (tile t goes to CTA t mod grid), rasterised in groups of
    `group_m` M-tiles so that the CTAs running at one time share x rows and W rows in L2.
  * split-K (`split_k` > 1, decode): work unit = (tile, K slice); the slices' fp32 partials meet
    in a workspace and the last slice to finish stores the tile (`_split_k_merge`).
The schedule, the producer warp's loop over the ring, the consumers' fragments and the split-K
fix-up are shared with the bf16 kernel (kernels/gemm/persistent_sm90.py).

The activation scales are MN-major (sa[m, j] at m + j * ld, ld = M rounded up to 4: the layout
DeepGEMM takes and serving stacks' quant kernels write), so a stage's sa box is one contiguous
column of bm values: a single TMA request. (Row-major sa made the box bm 16-byte rows, 256 requests
per stage at bm = 256, and cost the plain mainloop 15%: docs/perf/gemm.md, v4.) The weight scale is
one value per tile and K block because bn divides 128; a TMA box row needs 16 bytes, so sw comes as
a box of SCALE_BOX = 4 K blocks (one used per stage) from rows a multiple of 4 K blocks long (the
glue pads the rare K that is not).
"""

from __future__ import annotations


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_wait
from cutlass.utils import LayoutEnum

from kernels.gemm.persistent_sm90 import PersistentGemmSm90, tma_slices
from kernels.gemm.tiling import EPI_N, KBLOCK, SCALE_BOX, STAMP_SLOTS, SW_SLOT, GemmConfig
from kernels.regs import fence_operand, mn_view
from kernels.rings import consumer_state


# GemmConfig.stamps: a CTA's slots (clock cycles but the two globaltimer_lo ns); the merge stamp only where it stores
(STAMP_ENTRY_NS, STAMP_ENTRY, STAMP_LOADS, STAMP_FIRST_STAGE, STAMP_MAINLOOP, STAMP_MERGED, STAMP_EXIT,
 STAMP_EXIT_NS) = range(8)


class Fp8GemmSm90(PersistentGemmSm90):
    cfg: GemmConfig

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # x (M, G*K) fp8 e4m3, K contiguous
        mSA: cute.Tensor,  # (M, G*K/128) fp32, MN-major: stride (1, ld), ld a multiple of 4
        mB: cute.Tensor,  # W (N, K) fp8 e4m3, K contiguous (N = G*Ng)
        mSB: cute.Tensor,  # (ceil(N/128), Kp/128) fp32
        mC: cute.Tensor,  # y (M, N) bf16, N contiguous
        mWork: cute.Tensor,  # split-K: (tiles * bm * bn,) fp32 tile sums, zero between calls; else unused
        mCount: cute.Tensor,  # split-K: (tiles,) int32 arrival counters, zero between calls
        n_group: cutlass.Int32,  # output columns per group (N: one group)
        n_ctas: cutlass.Int32,  # persistent grid size (the SM count)
        stream: cuda.CUstream,
    ):
        c = self.cfg
        S = c.n_stages
        fp8 = mA.element_type

        def make_mma(wgs=c.n_mma_wg):
            return sm90_utils.make_trivial_tiled_mma(
                fp8, mB.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (wgs, 1, 1), (64, c.bn),
            )

        # two copies of the MMA: the first k-step of a block overwrites (ACCUMULATE off), the rest
        # accumulate; each is set once at kernel entry (toggling one MMA inside the loops makes a
        # value that does not dominate its later uses)
        tiled_mma, mma_acc = make_mma(), make_mma()
        epi_mma = make_mma(c.n_mma_wg // c.epi_groups)  # the threads that store one epilogue tile
        tile = (c.wave_m, c.bn, KBLOCK)
        # A: one (wave_m x 128) buffer per wave and stage, index stage * waves + wave
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, fp8, S * c.waves)
        sA_tma_layout = sA_layout
        if cutlass.const_expr(c.x_rows < c.wave_m):
            sA_layout, sA_tma_layout = small_x_layouts(sA_layout, c.x_rows, c.x_load_rows)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, mB.element_type, S)
        epi_tile = (c.epi_rows, EPI_N)  # buffer index: stage * epi_groups + group
        sC_layout = sm90_utils.make_smem_layout_epi(mC.element_type, LayoutEnum.ROW_MAJOR, epi_tile,
                                                    c.epi_stages * c.epi_groups)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        # a CTA pair (cluster_n 2) multicasts its x waves: rank r loads wave r into both CTAs
        g2s_a = cpasync.CopyBulkTensorTileG2SMulticastOp() if c.cluster_n > 1 else g2s
        tma_a, gA_t = cpasync.make_tiled_tma_atom(g2s_a, mA, cute.slice_(sA_tma_layout, (None, None, 0)),
                                                  (c.x_load_rows, KBLOCK))
        tma_b, gB_t = cpasync.make_tiled_tma_atom(g2s, mB, cute.slice_(sB_layout, (None, None, 0)), (c.bn, KBLOCK))
        tma_c, gC_t = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mC, cute.slice_(sC_layout, (None, None, 0)), epi_tile
        )
        # scales ride in the stage: the tile's bm sa values of K block kb (one column of MN-major sa)
        # and the (1 x 4) box of the tile's sw row holding kb (and the next 3, unused); [stage] outermost
        sSA_layout = cute.make_layout((c.bm, 1, S), stride=(1, c.bm, c.sa_slot))
        # (a TMA destination is 128-byte aligned: one 128-byte slot per stage and sw box; bn 192
        # spans two weight-scale blocks, whose rows come as two boxes: [block, stage] outermost)
        B = c.sw_blocks
        sSW_layout = cute.make_layout((1, SCALE_BOX, (B, S)), stride=(SCALE_BOX, 1, (SW_SLOT, B * SW_SLOT)))
        sSA_tma_layout = cute.make_layout((c.sa_rows, 1, S), stride=(1, c.bm, c.sa_slot))  # the box: sa_rows of bm
        tma_sa, gSA_t = cpasync.make_tiled_tma_atom(g2s, mSA, cute.slice_(sSA_tma_layout, (None, None, 0)),
                                                    (c.sa_rows, 1))
        tma_sw, gSW_t = cpasync.make_tiled_tma_atom(g2s, mSB, cute.slice_(sSW_layout, (None, None, 0)),
                                                    (1, SCALE_BOX))

        Storage = self._storage(
            sSA=(cutlass.Float32, sSA_layout, 128), sSW=(cutlass.Float32, sSW_layout, 128),
            sA=(fp8, sA_layout, 1024), sB=(mB.element_type, sB_layout, 1024), sC=(mC.element_type, sC_layout, 1024),
        )
        grid = self._grid(mA, mB, n_ctas, c.cluster_n)
        self.kernel(
            tma_a, gA_t, tma_b, gB_t, tma_c, gC_t, tma_sa, gSA_t, tma_sw, gSW_t, mWork, mCount, n_group,
            tiled_mma, mma_acc, epi_mma, sA_layout, sA_tma_layout, sB_layout, sC_layout, sSA_layout, sSA_tma_layout,
            sSW_layout, Storage,
        ).launch(grid=(grid, 1, 1), block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream, use_pdl=c.pdl,
                 # only pairs and split-K clusters launch as clusters: single CTAs launched with a 1 x 1 x 1
                 # cluster ran 128 x 128 tiles 27% slower (same SASS; docs/lessons/gemm.md)
                 **({"cluster": [c.cluster_n, 1, 1]} if c.cluster_n > 1 else
                    {"cluster": [c.split_k, 1, 1]} if c.cluster_k else {}))

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        gA_t: cute.Tensor,
        tma_b: cute.CopyAtom,
        gB_t: cute.Tensor,
        tma_c: cute.CopyAtom,
        gC_t: cute.Tensor,
        tma_sa: cute.CopyAtom,
        gSA_t: cute.Tensor,
        tma_sw: cute.CopyAtom,
        gSW_t: cute.Tensor,
        mWork: cute.Tensor,
        mCount: cute.Tensor,
        n_group: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        mma_acc: cute.TiledMma,
        epi_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sA_tma_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        sSA_layout: cute.Layout,
        sSA_tma_layout: cute.Layout,
        sSW_layout: cute.Layout,
        Storage: cutlass.Constexpr,
    ):
        c = self.cfg
        W = c.waves
        CN = c.cluster_n
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        # single CTAs keep the exact code of the unpaired kernel (a 128 x 128 tile ran 20-25% slower
        # when its loops carried the pair's index arithmetic with CN = 1; docs/lessons/gemm.md)
        step0, steps = bidx, gdim  # the CTA's (or cluster's) first work unit, CTAs (clusters) in the grid
        if cutlass.const_expr(CN > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # N tile in the step, x wave
            step0, steps = bidx // CN, gdim // CN
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        mmas = (tiled_mma, mma_acc)
        if cutlass.const_expr(c.stamps):  # phase stamps (GemmConfig.stamps): slot j of this CTA's STAMP_SLOTS
            stamps = cute.recast_tensor(mWork, cutlass.Int32)
            stamp0 = bidx * STAMP_SLOTS
            if tidx == 0:
                stamps[stamp0 + STAMP_ENTRY_NS] = cute.arch.globaltimer_lo()
                stamps[stamp0 + STAMP_ENTRY] = cute.arch.clock()

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)
            cpasync.prefetch_descriptor(tma_sa)
            cpasync.prefetch_descriptor(tma_sw)

        st, ring, sA, sB = self._stages(Storage, sA_layout, sB_layout, CN)
        sA_tma = sA  # the TMA's view of the x stages: the wgmma's, but for the small x tiles
        if cutlass.const_expr(c.x_rows < c.wave_m):
            sA_tma = st.sA.get_tensor(sA_tma_layout.outer, swizzle=sA_tma_layout.inner)
        sC = st.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        sSA = st.sSA.get_tensor(sSA_layout)
        sSW = st.sSW.get_tensor(sSW_layout)

        # (x_load_rows, 128, row tiles, G*kb), (bn, 128, tiles_n, kb), (epi_rows, bn, row tiles, tiles_n)
        gA = cute.local_tile(gA_t, (c.x_load_rows, KBLOCK), (None, None))
        gB = cute.local_tile(gB_t, (c.bn, KBLOCK), (None, None))
        gC = cute.local_tile(gC_t, (c.epi_rows, c.bn), (None, None))
        tAsA, tAgA = tma_slices(tma_a, sA_tma, gA)
        tBsB, tBgB = tma_slices(tma_b, sB, gB)
        # (bm, 1, M tiles, G*K blocks), (1, 4, N/128 blocks, K blocks / 4)
        gSA = cute.local_tile(gSA_t, (c.sa_rows, 1), (None, None))
        gSW = cute.local_tile(gSW_t, (1, SCALE_BOX), (None, None))
        sSA_tma = sSA  # the TMA's view: the first sa_rows of each stage's bm values (GemmConfig.x_box)
        if cutlass.const_expr(c.sa_rows < c.bm):
            sSA_tma = cute.make_tensor(sSA.iterator, sSA_tma_layout)
        tSAs, tSAg = tma_slices(tma_sa, sSA_tma, gSA)
        tSWs, tSWg = tma_slices(tma_sw, sSW, gSW)

        row_tiles = cute.size(gA, mode=[2])  # x_rows-row tiles of M
        tiles_m = (row_tiles + W - 1) // W
        tiles_n = cute.size(gB, mode=[2])
        steps_n = (tiles_n + CN - 1) // CN if cutlass.const_expr(CN > 1) else tiles_n
        n_kb = cute.size(gB, mode=[3])  # K blocks of one group
        units = tiles_m * steps_n * c.split_k
        kb_per = (n_kb + c.split_k - 1) // c.split_k

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape(CN))
        if cutlass.const_expr(c.stamps):
            if tidx == 0:  # the producer's lane 0: its first load follows
                stamps[stamp0 + STAMP_LOADS] = cute.arch.clock()

        if wg == 0:
            # ---------------- producer: one warp issues the TMA loads ----------------
            def locate(tm, tn):
                """The unit's m tile, n tile, first K block of x (and column of sa), sw row."""
                grp = (tn * c.bn) // n_group
                if cutlass.const_expr(CN > 1):
                    # the group of the step's first tile: a pair's second tile may lie past N (and
                    # past the last group), but it shares the x tile its partner multicasts
                    grp = (tn * CN * c.bn) // n_group
                    tn = tn * CN + rank
                a_kb = grp * n_kb  # the group's first K block of x (and column of sa)
                sb_row = (tn * c.bn) // KBLOCK
                return tm, tn, a_kb, sb_row

            def load_x(where, kb, state, bar):
                """K block kb's x waves into the stage."""
                tm, tn, a_kb, sb_row = where
                if cutlass.const_expr(CN > 1):
                    cute.copy(tma_a, tAgA[(None, tm * W + rank, a_kb + kb)],
                              tAsA[(None, state.index * W + rank)], tma_bar_ptr=bar,
                              mcast_mask=cutlass.Int16((1 << CN) - 1))
                else:
                    for w in cutlass.range_constexpr(W - 1 if c.ablate == "half-a" else W):
                        cute.copy(tma_a, tAgA[(None, tm * W + w, a_kb + kb)],
                                  tAsA[(None, state.index * W + w)], tma_bar_ptr=bar)

            def load_w(where, kb, state, bar):
                """K block kb's W tile into the stage."""
                tm, tn, a_kb, sb_row = where
                if cutlass.const_expr(c.ablate != "no-b"):
                    cute.copy(tma_b, tBgB[(None, tn, kb)], tBsB[(None, state.index)], tma_bar_ptr=bar)

            def load_sa(where, kb, state, bar):
                tm, tn, a_kb, sb_row = where
                cute.copy(tma_sa, tSAg[(None, tm, a_kb + kb)], tSAs[(None, state.index)], tma_bar_ptr=bar)

            def load_sw(where, kb, state, bar):
                tm, tn, a_kb, sb_row = where
                for b in cutlass.range_constexpr(c.sw_blocks):  # rows past N: zero-filled, never read
                    cute.copy(tma_sw, tSWg[(None, sb_row + b, kb // SCALE_BOX)],
                              tSWs[(None, b + c.sw_blocks * state.index)], tma_bar_ptr=bar)

            def load(where, kb, state, bar):
                """K block kb's x waves, W tile and scale boxes into the stage (knock-out no-aux: the W tile alone)."""
                if cutlass.const_expr(c.ablate != "no-aux"):
                    load_x(where, kb, state, bar)
                load_w(where, kb, state, bar)
                if cutlass.const_expr(c.ablate != "no-aux"):
                    load_sa(where, kb, state, bar)
                    load_sw(where, kb, state, bar)

            def load_weight(where, kb, state, bar):
                """PDL: what does not depend on the previous kernel (the W tile and its scales)."""
                load_w(where, kb, state, bar)
                load_sw(where, kb, state, bar)

            def load_activation(where, kb, state, bar):
                """PDL: what the previous kernel writes (the x tile and its scales)."""
                load_x(where, kb, state, bar)
                load_sa(where, kb, state, bar)

            if cutlass.const_expr(c.pdl):
                self._produce(warp_idx, ring, step0, units, steps, tiles_m, steps_n, kb_per, n_kb, locate,
                              load_weight, load_activation)
            else:
                self._produce(warp_idx, ring, step0, units, steps, tiles_m, steps_n, kb_per, n_kb, locate, load)
        else:
            # ---------------- consumers: wgmma + promotion + epilogue ----------------
            mtid, thr_mma, tCrA, tCrB = self._consumer(tiled_mma, sA, sB, tidx)
            acc_shape = thr_mma.partition_shape_C((c.wave_m, c.bn))
            accs = [cute.make_rmem_tensor(acc_shape, cutlass.Float32) for _ in range(W)]
            tmps = [cute.make_rmem_tensor(acc_shape, cutlass.Float32) for _ in range(2 if c.chain > 1 else 1)]
            cC_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.wave_m, c.bn))))
            n_rows = cute.size(cC_mn, mode=[0])

            # epilogue: registers -> smem (stmatrix) -> TMA store, as epi_rows x 32 slices, by the whole
            # wave (one group) or by each warpgroup on its own rows (epi_per_wg)
            egrp = (wg - 1) if cutlass.const_expr(c.epi_groups > 1) else 0
            store_op = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, cutlass.BFloat16, cutlass.Float32)
            stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.BFloat16)
            r2s = cute.make_tiled_copy_S(store_op, cute.make_tiled_copy_C_atom(stm_atom, epi_mma))
            thr_r2s = r2s.get_slice(mtid - egrp * 128)
            tRS_sC = thr_r2s.partition_D(sC)
            rD_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
            tRS_f32 = cute.make_rmem_tensor(rD_shape, cutlass.Float32)
            tRS_bf16 = cute.make_rmem_tensor(rD_shape, cutlass.BFloat16)
            per_slice = cute.size(tRS_f32)
            epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)
            store_bar = epi_bar
            if cutlass.const_expr(c.epi_groups > 1):
                store_bar = pipeline.NamedBarrier(barrier_id=2 + egrp, num_threads=128)
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=c.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * c.n_mma_wg),
            )
            n_slices = c.bn // EPI_N

            # the tile rows (in sSA) whose scales this thread applies: wave w, fragment row r (a small
            # x tile's rows past bm are never stored: they take a row inside the stage's sa box)
            lrows = cute.make_rmem_tensor((W, n_rows), cutlass.Int32)
            for w in cutlass.range_constexpr(W):
                for r in cutlass.range_constexpr(n_rows):
                    lrows[w, r] = w * c.wave_m + cC_mn[r, 0][0]
                    if cutlass.const_expr(c.bm < 64):
                        lrows[w, r] = lrows[w, r] % c.bm

            g_rd = cutlass.Int32(0)  # K blocks this CTA has consumed (its ring position)
            flag = st.flag.get_tensor(cute.make_layout((4,)))
            slices_done = cutlass.Int32(0)
            for u in cutlass.range(step0, units, steps, unroll=1):
                tm, tn, ks, t = self._tile_of(u, tiles_m, steps_n)
                stores = True
                if cutlass.const_expr(CN > 1):
                    tn = tn * CN + rank
                    stores = tn < tiles_n  # a pair's second tile past N stores nothing
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                for w in cutlass.range_constexpr(W):
                    accs[w].fill(0.0)
                if cutlass.const_expr(c.stamps):
                    if u == step0 and mtid == 0 and kb1 > kb0:  # the first stage landed (the loop's wait then passes)
                        ring.consumer_wait(self._stage(g_rd))
                        stamps[stamp0 + STAMP_FIRST_STAGE] = cute.arch.clock()
                if cutlass.const_expr(c.chain > 1):
                    g_rd = self._mainloop_overlapped(ring, mmas, tCrA, tCrB, accs[0], tmps, sSA, sSW, lrows,
                                                     kb0, kb1, g_rd, (tn % 2) == 1)
                else:
                    g_rd = self._mainloop(ring, mmas, tCrA, tCrB, accs, tmps[0], sSA, sSW, lrows, kb0, kb1, g_rd,
                                          (tn % 2) == 1)
                if cutlass.const_expr(c.stamps):
                    if u == step0 and mtid == 0:
                        stamps[stamp0 + STAMP_MAINLOOP] = cute.arch.clock()
                if self._tile_done(accs[0], mWork, mCount, flag, epi_bar, t, mtid, st, ks):
                    if cutlass.const_expr(c.stamps):
                        if u == step0 and mtid == 0:
                            stamps[stamp0 + STAMP_MERGED] = cute.arch.clock()
                    for w in cutlass.range_constexpr(W):
                        row_tile = (tm * W + w) * c.epi_groups + egrp  # in epi_rows
                        if row_tile < cute.size(gC, mode=[2]) and stores:  # rows wholly past M store nothing
                            gC_tile = cute.zipped_divide(gC[(None, None, row_tile, tn)], (c.epi_rows, EPI_N))
                            bSG_sC, bSG_gC = cpasync.tma_partition(
                                tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_tile)
                            tRS_acc = r2s.retile(accs[w])
                            for e in cutlass.range_constexpr(n_slices):
                                for v in cutlass.range_constexpr(per_slice):
                                    tRS_f32[v] = tRS_acc[e * per_slice + v]
                                tRS_bf16.store(tRS_f32.load().to(cutlass.BFloat16))
                                buf = ((slices_done + e) % c.epi_stages) * c.epi_groups + egrp
                                cute.copy(r2s, tRS_bf16, tRS_sC[(None, None, None, buf)])
                                cute.arch.fence_proxy("async.shared", space="cta")
                                store_bar.arrive_and_wait()
                                if warp_idx == 4 + 4 * egrp:
                                    cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (0, e))])
                                    store_pipe.producer_commit()
                                    store_pipe.producer_acquire()
                                store_bar.arrive_and_wait()
                            slices_done = slices_done + n_slices
            store_pipe.producer_tail()
            if cutlass.const_expr(c.stamps):
                if mtid == 0:
                    stamps[stamp0 + STAMP_EXIT] = cute.arch.clock()
                    stamps[stamp0 + STAMP_EXIT_NS] = cute.arch.globaltimer_lo()
        if cutlass.const_expr(CN > 1):
            # no CTA leaves while its pair may still signal its barriers or write its stages
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    # ---------------- the mainloop (consumer warpgroups) ----------------
    def _stage(self, g):
        """The ring state of the CTA's g-th K block."""
        return consumer_state(self.cfg.n_stages, g)

    @cute.jit
    def _issue(self, mmas, tmp, tCrA, tCrB, a_buf, b_buf):
        """The 4 wgmma (k = 32 each) of one 128-wide K block into tmp (overwritten), one group."""
        fence_operand(tmp)
        warpgroup.fence()
        k_steps = cute.size(tCrA, mode=[2]) // (2 if self.cfg.ablate == "half-k" else 1)
        for k in cutlass.range_constexpr(k_steps):
            cute.gemm(mmas[0] if k == 0 else mmas[1], tmp, tCrA[(None, None, k, a_buf)], tCrB[(None, None, k, b_buf)],
                      tmp)
        warpgroup.commit_group()

    @cute.jit
    def _read_scales(self, sc, sSA, sSW, lrows, kb, stage, odd):
        """sc[w, r, p] = sa[row, kb] * sw[n block, kb] from the stage's scale boxes (shared memory:
        read before the wgmmas are issued, as the wgmma fence waits for loads in flight). One part
        (p = 0) where bn divides 128; bn 192 (`_col_part`): columns 0-63 of the tile lie in its first
        weight-scale block, 128-191 in its second, and 64-127 in the first for an even tile (its first
        column a multiple of 128) or the second for an odd one."""
        kq = kb % SCALE_BOX
        sw0 = sSW[0, kq, (0, stage)]
        sws = [sw0]
        if cutlass.const_expr(self.cfg.sw_blocks == 2):
            sw1 = sSW[0, kq, (1, stage)]
            sws = [sw0, cutlass.select_(odd, sw1, sw0), sw1]
        for w in cutlass.range_constexpr(cute.size(sc, mode=[0])):
            for r in cutlass.range_constexpr(cute.size(sc, mode=[1])):
                sa = sSA[lrows[w, r], 0, stage]
                for p in cutlass.range_constexpr(len(sws)):
                    sc[w, r, p] = sa * sws[p]

    def _col_part(self, cc: int) -> int:
        """The scale part of a thread's accumulator column cc: the SM90 accumulator puts it at tile
        column 8 * (cc // 2) + (< 8, by lane), so its 64-column part is cc // 16 (bn 192), else 0."""
        return (8 * (cc // 2)) // 64 if self.cfg.sw_blocks == 2 else 0

    @cute.jit
    def _promote(self, acc, tmp, sc, w):
        """acc += the block's temporary * its scale."""
        fence_operand(tmp)  # after the wgmma wait that completed tmp
        acc_mn = mn_view(acc)
        tmp_mn = mn_view(tmp)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            for cc in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * sc[w, r, self._col_part(cc)]

    @cute.jit
    def _mainloop(self, ring, mmas, tCrA, tCrB, accs, tmp, sSA, sSW, lrows, kb0, kb1, g_rd, odd):
        """Per K block: wait for the stage -> read its scales -> per wave: 4 wgmma -> wait_group(0) ->
        (last wave: release the stage) -> promote.
        The tensor core idles while a warpgroup promotes unless the other's wgmmas fill it; at one wave
        they promote together, so the rule chains those (lesson gemm 20; two waves: no registers). odd:
        the tile's N index is odd (bn 192: `_read_scales`). The ring position is recomputed from g_rd every
        K block: carrying it (a compare and a select instead of a division) was 2-3% faster on some 256 x 128
        shapes but up to 25% slower where each CTA runs one long-K tile (docs/lessons/gemm.md 11)."""
        c = self.cfg
        S = c.n_stages
        W = c.waves
        plain = c.ablate == "no-promote"  # knock-out: a plain FP8 GEMM, wgmmas straight into acc
        sc = cute.make_rmem_tensor((*lrows.shape, 3 if c.sw_blocks == 2 else 1), cutlass.Float32)
        unscaled = c.ablate in ("no-promote", "const-scale")
        if cutlass.const_expr(unscaled):
            sc.fill(1.0)
        for kb in cutlass.range(kb0, kb1, unroll=c.unroll):
            st = self._stage(g_rd)
            ring.consumer_wait(st)
            if cutlass.const_expr(not unscaled):
                self._read_scales(sc, sSA, sSW, lrows, kb, st.index, odd)
            for w in cutlass.range_constexpr(W):
                self._issue((mmas[1], mmas[1]) if plain else mmas, accs[w] if plain else tmp, tCrA, tCrB,
                            st.index * W + w, st.index)
                warpgroup.wait_group(0)
                if w == W - 1:
                    ring.consumer_release(st)
                if cutlass.const_expr(not plain):
                    self._promote(accs[w], tmp, sc, w)
            g_rd = g_rd + 1
        return g_rd

    @cute.jit
    def _take(self, ring, mmas, tmp, tCrA, tCrB, sc, sSA, sSW, lrows, kb, g, odd):
        """Wait for the g-th stage (K block kb), read its scales into sc and issue its wgmmas into tmp."""
        st = self._stage(g)
        ring.consumer_wait(st)
        self._read_scales(sc, sSA, sSW, lrows, kb, st.index, odd)
        self._issue(mmas, tmp, tCrA, tCrB, st.index, st.index)

    @cute.jit
    def _mainloop_overlapped(self, ring, mmas, tCrA, tCrB, acc, tmps, sSA, sSW, lrows, kb0, kb1, g_rd, odd):
        """Each consumer warpgroup (one wave), K blocks in chains of `chain` (GemmConfig.chain): inside a chain,
        block j + 1's wgmmas (into tmps[(j + 1) % 2]) are issued before block j is waited for
        (wait_group(1)), released and promoted, so a block's wgmma latency hides behind the previous
        block's promotion. Each chain ends in wait_group(0): a group in flight across the loop's back
        edge, or a wgmma under a runtime branch, makes ptxas serialise every wgmma (docs/lessons/gemm.md
        9, fmha.md 13). The K blocks past the last whole chain go one at a time."""
        C = self.cfg.chain
        scs = [cute.make_rmem_tensor((*lrows.shape, 3 if self.cfg.sw_blocks == 2 else 1), cutlass.Float32)
               for _ in range(2)]
        n = kb1 - kb0  # 0 for a split-K slice past the last K block
        chains = n // C
        for ch in cutlass.range(0, chains, unroll=1):
            first = ch * C
            self._take(ring, mmas, tmps[0], tCrA, tCrB, scs[0], sSA, sSW, lrows, kb0 + first, g_rd + first, odd)
            for j in cutlass.range_constexpr(C):
                if cutlass.const_expr(j + 1 < C):
                    nxt = first + j + 1
                    self._take(ring, mmas, tmps[(j + 1) % 2], tCrA, tCrB, scs[(j + 1) % 2], sSA, sSW, lrows,
                               kb0 + nxt, g_rd + nxt, odd)
                    warpgroup.wait_group(1)
                else:
                    warpgroup.wait_group(0)
                ring.consumer_release(self._stage(g_rd + first + j))
                self._promote(acc, tmps[j % 2], scs[j % 2], 0)
        for i in cutlass.range(chains * C, n, unroll=1):
            self._take(ring, mmas, tmps[0], tCrA, tCrB, scs[0], sSA, sSW, lrows, kb0 + i, g_rd + i, odd)
            warpgroup.wait_group(0)
            ring.consumer_release(self._stage(g_rd + i))
            self._promote(acc, tmps[0], scs[0], 0)
        return g_rd + n


def small_x_layouts(sA_layout: cute.ComposedLayout, x_rows: int, box_rows: int):
    """The x stages of a 16 / 32-row tile (DeepGEMM's decode trick): stage s begins x_rows * 128
    bytes after stage s - 1, the TMA writes x_rows rows there, and the m64 wgmma reads 64 rows from
    there, the rows past x_rows running on the stages that follow (garbage, never stored). Both views
    keep the 128-byte swizzle atom (8 rows); every stage begins on a multiple of 1024 bytes, so the
    swizzle (address bits 4-6 ^ 7-9) is the same in both. The TMA view holds box_rows (<= x_rows) rows a
    stage (GemmConfig.x_box: 1-8 rows, less than the swizzle atom). Returns (wgmma view, TMA view); the
    wgmma view's cosize covers the last stage's 64 rows."""
    outer = sA_layout.outer
    (atom_rows, _atoms), k_mode, _stages = outer.shape
    (row_stride, atom_stride), k_stride, (_, _) = outer.stride
    stages = cute.size(outer, mode=[2])
    stage = (0, x_rows * KBLOCK)

    def view(rows):
        rows_mode = (atom_rows, rows // atom_rows) if rows >= atom_rows else (rows, 1)
        return cute.make_composed_layout(sA_layout.inner, 0, cute.make_layout(
            (rows_mode, k_mode, (1, stages)), stride=((row_stride, atom_stride), k_stride, stage)))

    return view(64), view(box_rows)
