"""SM90 bf16 GEMM: y[M, N] = x[M, K] . W[N, K]^T, x and W bf16 (K-major), fp32 accumulation, y fp32
or bf16 (row-major; its dtype is the output tensor's).

The model's GEMMs on BF16 checkpoint weights (lm_head, the compressors' wkv / wgate, the indexer's
weights_proj): the reference runs them as fp32 products of bf16 values, which a bf16 tensor-core
GEMM with fp32 accumulation computes up to summation order (every product of two bf16 values is
exact in fp32). A kernel of its own (not a mode of the FP8 kernel in gemm_sm90.py, whose index
arithmetic is left untouched: docs/lessons/gemm.md, lesson 8); it shares that kernel's scaffolding
(kernels/gemm/persistent_sm90.py: the static persistent schedule rasterised in groups of group_m
M-tiles, the producer warp's loop over the TMA ring, the consumers' fragments, the split-K fix-up
whose fp32 partials meet in the shared workspace, glue.workspace) and the TMA ring (kernels/rings.py).

Structure (one CTA per SM, persistent; Bf16Config in kernels/gemm/bf16_config.py):
  * warpgroup 0: warp 0 issues the TMA loads of the (bm x 64) x tile and (bn x 64) W tile of each
    K block (128 bytes of a row: one 128-byte swizzle atom) into an `n_stages`-deep ring. Rows past
    M or N and columns past K are zero-filled by TMA, so ragged M, N and K need no padding copies
    (K only a multiple of 8: TMA needs 16-byte row strides).
  * consumer warpgroups (1 for bm = 64, 2 for bm = 128; 64 rows each): per K block 4 wgmma
    (m64 n{bn} k16) accumulate straight into the fp32 accumulator (no promotion); one wgmma group
    stays in flight (wait_group(1)), and a stage is released once the group that read it is done.
  * grouped mode (Bf16Config.group_n = Ng, compile-time; wo_a as the reference's bf16 einsum):
    y[:, g*Ng:(g+1)*Ng] = x[:, g*K:(g+1)*K] . W[g*Ng:(g+1)*Ng, :]^T for G groups in one launch, x
    [M, G*K]: an N tile lies in one group (bn divides Ng), and only its x loads move, by g*K.
  * epilogue: registers -> global memory directly, predicated on the tile's rows < M and columns
    < N (no shared memory, so the ring gets all of it). The output is small next to W at decode
    (the case the kernel is built for: lm_head writes 4 B per 8 KB..14 KB of weight a logit).
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

from kernels.gemm.bf16_config import BK, Bf16Config
from kernels.gemm.persistent_sm90 import PersistentGemmSm90, tma_slices
from kernels.regs import fence_operand, mn_view
from kernels.rings import consumer_state


class Bf16GemmSm90(PersistentGemmSm90):
    cfg: Bf16Config

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # x (M, K) bf16, K contiguous
        mB: cute.Tensor,  # W (N, K) bf16, K contiguous
        mC: cute.Tensor,  # y (M, N) fp32 or bf16, N contiguous
        mWork: cute.Tensor,  # split-K: (tiles * bm * bn,) fp32 tile sums, zero between calls; else unused
        mCount: cute.Tensor,  # split-K: (tiles,) int32 arrival counters, zero between calls
        n_ctas: cutlass.Int32,  # persistent grid size (the SM count)
        stream: cuda.CUstream,
    ):
        c = self.cfg
        S = c.n_stages
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            mA.element_type, mB.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (c.n_mma_wg, 1, 1), (64, c.bn),
        )
        tile = (c.bm, c.bn, BK)
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, mA.element_type, S)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, mB.element_type, S)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA_t = cpasync.make_tiled_tma_atom(g2s, mA, cute.slice_(sA_layout, (None, None, 0)), (c.bm, BK))
        tma_b, gB_t = cpasync.make_tiled_tma_atom(g2s, mB, cute.slice_(sB_layout, (None, None, 0)), (c.bn, BK))

        Storage = self._storage(sA=(mA.element_type, sA_layout, 1024), sB=(mB.element_type, sB_layout, 1024))
        grid = self._grid(mA, mB, n_ctas)
        self.kernel(tma_a, gA_t, tma_b, gB_t, mC, mWork, mCount, tiled_mma, sA_layout, sB_layout,
                    Storage).launch(grid=(grid, 1, 1), block=[c.threads, 1, 1], min_blocks_per_mp=1,
                                    stream=stream)

    # a kernel's parameter list is its compiled signature (the launch ABI and the mangled name in the
    # cubin): this one stays written out here, though it begins as the FP8 kernel's
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        gA_t: cute.Tensor,
        tma_b: cute.CopyAtom,
        gB_t: cute.Tensor,
        mC: cute.Tensor,
        mWork: cute.Tensor,
        mCount: cute.Tensor,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
    ):
        c = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)  # the accumulator is zeroed per tile

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)

        st, ring, sA, sB = self._stages(Storage, sA_layout, sB_layout)
        # (bm, 64, M tiles, K blocks), (bn, 64, N tiles, K blocks)
        gA = cute.local_tile(gA_t, (c.bm, BK), (None, None))
        gB = cute.local_tile(gB_t, (c.bn, BK), (None, None))
        tAsA, tAgA = tma_slices(tma_a, sA, gA)
        tBsB, tBgB = tma_slices(tma_b, sB, gB)
        tiles_m = cute.size(gA, mode=[2])
        tiles_n = cute.size(gB, mode=[2])
        n_kb = cute.size(gB, mode=[3])
        units = tiles_m * tiles_n * c.split_k
        kb_per = (n_kb + c.split_k - 1) // c.split_k

        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            # ---------------- producer: one warp issues the TMA loads ----------------
            def locate(tm, tn):
                """The unit's x rows are M tile tm, its W rows N tile tn; grouped, its x columns start
                at its group's K (the group of its output columns)."""
                if cutlass.const_expr(c.group_n):
                    return tm, tn, (tn * c.bn // c.group_n) * n_kb
                return tm, tn

            def load(where, kb, state, bar):
                """K block kb's x and W tiles into the stage."""
                if cutlass.const_expr(c.group_n):
                    tm, tn, a_kb = where
                    cute.copy(tma_a, tAgA[(None, tm, a_kb + kb)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                else:
                    tm, tn = where
                    cute.copy(tma_a, tAgA[(None, tm, kb)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, tn, kb)], tBsB[(None, state.index)], tma_bar_ptr=bar)

            self._produce(warp_idx, ring, bidx, units, gdim, tiles_m, tiles_n, kb_per, n_kb, locate, load)
        else:
            # ---------------- consumers: wgmma + epilogue ----------------
            mtid, thr_mma, tCrA, tCrB = self._consumer(tiled_mma, sA, sB, tidx)
            acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.bm, c.bn)), cutlass.Float32)
            cC = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.bm, c.bn))))
            epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)
            flag = st.flag.get_tensor(cute.make_layout((4,)))
            m = cute.size(mC, mode=[0])
            n = cute.size(mC, mode=[1])
            g_rd = cutlass.Int32(0)  # K blocks this CTA has consumed (its ring position)
            for u in cutlass.range(bidx, units, gdim, unroll=1):
                tm, tn, ks, t = self._tile_of(u, tiles_m, tiles_n)
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                acc.fill(0.0)
                g_rd = self._mainloop(ring, tiled_mma, tCrA, tCrB, acc, kb0, kb1, g_rd)
                if self._tile_done(acc, mWork, mCount, flag, epi_bar, t, mtid):
                    self._store(acc, mC, cC, thr_mma, tm, tn, m, n)

    @cute.jit
    def _mainloop(self, ring, tiled_mma, tCrA, tCrB, acc, kb0, kb1, g_rd):
        """Per K block: wait for the stage -> 4 wgmma into acc -> commit -> wait until one group is
        in flight -> release the previous block's stage (its wgmmas are done). CUTLASS's
        warp-specialised mainloop, with the accumulator pinned around each issue and wait."""
        S = self.cfg.n_stages
        fence_operand(acc)
        for kb in cutlass.range(kb0, kb1, unroll=self.cfg.unroll):
            st = consumer_state(S, g_rd)
            ring.consumer_wait(st)
            fence_operand(acc)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, k, st.index)], tCrB[(None, None, k, st.index)], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            fence_operand(acc)
            if kb > kb0:
                ring.consumer_release(consumer_state(S, g_rd - 1))
            g_rd = g_rd + 1
        warpgroup.wait_group(0)
        fence_operand(acc)
        if kb1 > kb0:
            ring.consumer_release(consumer_state(S, g_rd - 1))
        return g_rd

    @cute.jit
    def _store(self, acc, mC, cC, thr_mma, tm, tn, m, n):
        """The tile's accumulator -> y, each element predicated on row < M and column < N."""
        c = self.cfg
        gC = cute.local_tile(mC, (c.bm, c.bn), (tm, tn))
        tCgC = mn_view(thr_mma.partition_C(gC))
        acc_mn = mn_view(acc)
        rows_left = m - tm * c.bm
        cols_left = n - tn * c.bn
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            if cC[r, 0][0] < rows_left:
                for j in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                    if cC[r, j][1] < cols_left:
                        tCgC[r, j] = acc_mn[r, j].to(mC.element_type)
