"""SM90 FP8 block-scaled GEMM (DSV4 linear layers): y[M, N] = x[M, K] . W[N, K]^T, bf16 out.

Recipe (DSV4_SPEC.md §2.3 / §2.6, the reference's fp8_gemm and DeepGEMM's sm90 1d2d kernel):
x and W are FP8 e4m3, K-major. The activation carries one fp32 scale per (row, 128 columns of K)
(`sa` [M, K/128]); the weight one per 128 x 128 block (`sw` [ceil(N/128), K/128]). For every
128-wide K block the warpgroup runs its wgmmas into a temporary fp32 accumulator (tensor-core
accumulation stays inside one block), then promotes: acc += tmp * (sa[row, kb] * sw[n_blk, kb]).

Structure (one CTA per SM, persistent):
  * warpgroup 0: warp 0 issues the TMA loads of the (bm x 128) x tile and (bn x 128) W tile of each
    K block into a `stages`-deep ring (PipelineTmaAsync: full barrier with transaction bytes,
    empty barrier with one arrive per consumer warp). Rows past M or N are zero-filled by TMA.
  * warpgroups 1..bm/64: each owns 64 rows of the tile and all bn columns; it waits for a stage,
    issues 4 wgmma (m64 n{bn} k32) into `tmp`, waits for them, frees the stage and promotes.
    The scales of K block kb + 1 are loaded from global memory (L2) while block kb runs.
  * epilogue: acc -> bf16 -> shared memory (stmatrix) -> TMA store in (bm x 32) slices; TMA clips
    rows / columns past M / N, so ragged shapes need no padding copies.
  * tiles are handed out statically (tile t goes to CTA t mod grid), rasterised in groups of
    `group_m` M-tiles so that the CTAs running at one time share x rows and W rows in L2.
  * split-K (`split_k` > 1, decode): work unit = (tile, K slice). Every slice but the last to
    finish writes its fp32 partial into a workspace and bumps a per-tile counter; the last one
    adds the others' partials, stores bf16 and resets the counter to 0 for the next call.

The weight scale is one value per tile and K block because bn divides 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum

KBLOCK = 128  # the quantisation block along K: one promotion per 128 columns
SMEM_BYTES = 227 * 1024  # opt-in shared memory per CTA on sm_90
EPI_N = 32  # epilogue slice width (columns) per TMA store


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time tile configuration (kernels/gemm/config.py picks one per problem)."""

    bm: int = 128  # CTA rows: 64 (one consumer warpgroup) or 128 (two)
    bn: int = 128  # CTA columns: 32, 64 or 128 (divides the 128-wide weight-scale block)
    stages: int = 0  # smem ring depth; 0 = as many as fit
    group_m: int = 8  # rasterisation: M-tiles per group
    split_k: int = 1  # K slices per tile (decode: fill the SMs when M/N give too few tiles)
    epi_stages: int = 2

    def __post_init__(self) -> None:
        if self.bm not in (64, 128):
            raise ValueError(f"bm must be 64 or 128, got {self.bm}")
        if self.bn not in (32, 64, 128):
            raise ValueError(f"bn must be 32, 64 or 128, got {self.bn}")
        if self.split_k < 1:
            raise ValueError("split_k must be >= 1")
        if self.stages and self.stage_bytes * self.stages + self.fixed_bytes > SMEM_BYTES:
            raise ValueError(f"{self.stages} stages of {self.stage_bytes} B do not fit shared memory")

    @property
    def n_mma_wg(self) -> int:
        return self.bm // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.n_mma_wg)

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * KBLOCK

    @property
    def fixed_bytes(self) -> int:
        return self.bm * EPI_N * 2 * self.epi_stages + 2048

    @property
    def n_stages(self) -> int:
        if self.stages:
            return self.stages
        return min(8, (SMEM_BYTES - self.fixed_bytes) // self.stage_bytes)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer, consumer)."""
        return (40, 232) if self.n_mma_wg == 2 else (40, 256)


def _mn_view(t: cute.Tensor) -> cute.Tensor:
    """SM90 accumulator ((2,2,V),M,N) of one thread viewed as (rows, cols): ((2,M),(2,V,N))."""
    cm = cute.make_layout(t.layout.shape)
    mn = cute.make_layout(
        ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[0][2], cm.shape[2])),
        stride=((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[0][2], cm.stride[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))


class Fp8GemmSm90:
    def __init__(self, cfg: GemmConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # x (M, K) fp8 e4m3, K contiguous
        mSA: cute.Tensor,  # (M, K/128) fp32
        mB: cute.Tensor,  # W (N, K) fp8 e4m3, K contiguous
        mSB: cute.Tensor,  # (ceil(N/128), K/128) fp32
        mC: cute.Tensor,  # y (M, N) bf16, N contiguous
        mWork: cute.Tensor,  # split-K: (tiles * split_k * bm * bn,) fp32 partials; else unused
        mCount: cute.Tensor,  # split-K: (tiles,) int32 arrival counters, zero between calls
        n_ctas: cutlass.Int32,  # persistent grid size (the SM count)
        stream: cuda.CUstream,
    ):
        c = self.cfg
        S = c.n_stages
        fp8 = mA.element_type
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            fp8, mB.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (c.n_mma_wg, 1, 1), (64, c.bn),
        )
        tile = (c.bm, c.bn, KBLOCK)
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, fp8, S)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, mB.element_type, S)
        epi_tile = (c.bm, EPI_N)
        sC_layout = sm90_utils.make_smem_layout_epi(mC.element_type, LayoutEnum.ROW_MAJOR, epi_tile, c.epi_stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA_t = cpasync.make_tiled_tma_atom(g2s, mA, cute.slice_(sA_layout, (None, None, 0)), (c.bm, KBLOCK))
        tma_b, gB_t = cpasync.make_tiled_tma_atom(g2s, mB, cute.slice_(sB_layout, (None, None, 0)), (c.bn, KBLOCK))
        tma_c, gC_t = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mC, cute.slice_(sC_layout, (None, None, 0)), epi_tile
        )

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, S * 2]
            flag: cute.struct.MemRange[cutlass.Int32, 4]
            sA: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_layout)], 1024]
            sC: cute.struct.Align[cute.struct.MemRange[mC.element_type, cute.cosize(sC_layout)], 1024]

        m = cute.size(mA, mode=[0])
        n = cute.size(mB, mode=[0])
        units = ((m + c.bm - 1) // c.bm) * ((n + c.bn - 1) // c.bn) * c.split_k
        grid = cutlass.min(units, n_ctas)
        self.kernel(
            tma_a, gA_t, tma_b, gB_t, tma_c, gC_t, mSA, mSB, mWork, mCount, tiled_mma,
            sA_layout, sB_layout, sC_layout, Storage,
        ).launch(grid=(grid, 1, 1), block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    @cute.jit
    def _tile_of(self, u, tiles_m, tiles_n):
        """Work unit u -> (m tile, n tile, K slice): slices of a tile adjacent, tiles rasterised in
        groups of group_m M-tiles (a group walks N with its M-tiles side by side)."""
        c = self.cfg
        t = u // c.split_k
        ks = u - t * c.split_k
        per_group = c.group_m * tiles_n
        first_m = (t // per_group) * c.group_m
        gsize = cutlass.min(tiles_m - first_m, c.group_m)
        local = t - first_m * tiles_n
        return first_m + local % gsize, local // gsize, ks, t

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        gA_t: cute.Tensor,
        tma_b: cute.CopyAtom,
        gB_t: cute.Tensor,
        tma_c: cute.CopyAtom,
        gC_t: cute.Tensor,
        mSA: cute.Tensor,
        mSB: cute.Tensor,
        mWork: cute.Tensor,
        mCount: cute.Tensor,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
    ):
        c = self.cfg
        S = c.n_stages
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        tx_bytes = c.stage_bytes
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.bars.data_ptr(),
            num_stages=S,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, c.n_mma_wg * 4),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = st.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)

        # (bm, 128, tiles_m, kb), (bn, 128, tiles_n, kb), (bm, bn, tiles_m, tiles_n)
        gA = cute.local_tile(gA_t, (c.bm, KBLOCK), (None, None))
        gB = cute.local_tile(gB_t, (c.bn, KBLOCK), (None, None))
        gC = cute.local_tile(gC_t, (c.bm, c.bn), (None, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                           cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                           cute.group_modes(gB, 0, 2))

        m_size = cute.size(gA_t, mode=[0])
        tiles_m = cute.size(gA, mode=[2])
        tiles_n = cute.size(gB, mode=[2])
        n_kb = cute.size(gA, mode=[3])
        units = tiles_m * tiles_n * c.split_k
        kb_per = (n_kb + c.split_k - 1) // c.split_k

        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            # ---------------- producer: one warp issues the TMA loads ----------------
            cute.arch.setmaxregister_decrease(c.reg_split[0])
            if warp_idx == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
                for u in cutlass.range(bidx, units, gdim, unroll=1):
                    tm, tn, ks, _t = self._tile_of(u, tiles_m, tiles_n)
                    kb0 = ks * kb_per
                    kb1 = cutlass.min(kb0 + kb_per, n_kb)
                    for kb in cutlass.range(kb0, kb1, unroll=1):
                        ring.producer_acquire(state)
                        bar = ring.producer_get_barrier(state)
                        cute.copy(tma_a, tAgA[(None, tm, kb)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                        cute.copy(tma_b, tBgB[(None, tn, kb)], tBsB[(None, state.index)], tma_bar_ptr=bar)
                        ring.producer_commit(state)
                        state.advance()
                ring.producer_tail(state)
        else:
            # ---------------- consumers: wgmma + promotion + epilogue ----------------
            cute.arch.setmaxregister_increase(c.reg_split[1])
            mtid = tidx - 128
            thr_mma = tiled_mma.get_slice(mtid)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            acc_shape = thr_mma.partition_shape_C((c.bm, c.bn))
            acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
            tmp = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
            acc_mn = _mn_view(acc)
            tmp_mn = _mn_view(tmp)
            cC = thr_mma.partition_C(cute.make_identity_tensor((c.bm, c.bn)))
            cC_mn = _mn_view(cC)
            n_rows = cute.size(acc_mn, mode=[0])
            n_cols = cute.size(acc_mn, mode=[1])
            k_blocks = cute.size(tCrA, mode=[2])

            # epilogue: registers -> smem (stmatrix) -> TMA store, as bm x 32 slices
            store_op = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, cutlass.BFloat16, cutlass.Float32)
            stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.BFloat16)
            r2s = cute.make_tiled_copy_S(store_op, cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
            thr_r2s = r2s.get_slice(mtid)
            tRS_sC = thr_r2s.partition_D(sC)
            tRS_acc = r2s.retile(acc)
            rD_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
            tRS_f32 = cute.make_rmem_tensor(rD_shape, cutlass.Float32)
            tRS_bf16 = cute.make_rmem_tensor(rD_shape, cutlass.BFloat16)
            per_slice = cute.size(tRS_f32)
            epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=c.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * c.n_mma_wg),
            )
            slice_tiler = (c.bm, EPI_N)
            n_slices = c.bn // EPI_N

            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
            flag = st.flag.get_tensor(cute.make_layout((4,)))
            slices_done = cutlass.Int32(0)
            for u in cutlass.range(bidx, units, gdim, unroll=1):
                tm, tn, ks, t = self._tile_of(u, tiles_m, tiles_n)
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                sb_row = (tn * c.bn) // KBLOCK
                # the two (or 2*M) rows this thread accumulates, clamped into [0, M) for the scale loads
                rows = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
                for r in cutlass.range_constexpr(n_rows):
                    rows[r] = cutlass.min(tm * c.bm + cC_mn[r, 0][0], m_size - 1)
                sa_next = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
                for r in cutlass.range_constexpr(n_rows):
                    sa_next[r] = mSA[rows[r], kb0]
                sw_next = mSB[sb_row, kb0]
                acc.fill(0.0)
                for kb in cutlass.range(kb0, kb1, unroll=1):
                    scale = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
                    for r in cutlass.range_constexpr(n_rows):
                        scale[r] = sa_next[r] * sw_next
                    kn = cutlass.min(kb + 1, kb1 - 1)
                    for r in cutlass.range_constexpr(n_rows):
                        sa_next[r] = mSA[rows[r], kn]
                    sw_next = mSB[sb_row, kn]
                    ring.consumer_wait(state)
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(k_blocks):
                        tiled_mma.set(warpgroup.Field.ACCUMULATE, k != 0)
                        cute.gemm(tiled_mma, tmp, tCrA[(None, None, k, state.index)],
                                  tCrB[(None, None, k, state.index)], tmp)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    ring.consumer_release(state)
                    state.advance()
                    for r in cutlass.range_constexpr(n_rows):
                        for cc in cutlass.range_constexpr(n_cols):
                            acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * scale[r]

                last = True
                if cutlass.const_expr(c.split_k > 1):
                    last = self._split_k_merge(acc, mWork, mCount, flag, epi_bar, t, ks, mtid)
                if last:
                    gC_tile = cute.zipped_divide(gC[(None, None, tm, tn)], slice_tiler)
                    bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                                           gC_tile)
                    for e in cutlass.range_constexpr(n_slices):
                        for v in cutlass.range_constexpr(per_slice):
                            tRS_f32[v] = tRS_acc[e * per_slice + v]
                        tRS_bf16.store(tRS_f32.load().to(cutlass.BFloat16))
                        buf = (slices_done + e) % c.epi_stages
                        cute.copy(r2s, tRS_bf16, tRS_sC[(None, None, None, buf)])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        epi_bar.arrive_and_wait()
                        if warp_idx == 4:
                            cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (0, e))])
                            store_pipe.producer_commit()
                            store_pipe.producer_acquire()
                        epi_bar.arrive_and_wait()
                    slices_done = slices_done + n_slices
            store_pipe.producer_tail()

    @cute.jit
    def _split_k_merge(self, acc, mWork, mCount, flag, epi_bar, t, ks, mtid) -> cutlass.Boolean:
        """Split-K: publish this slice's fp32 partial, count arrivals; the last slice to arrive
        adds the other partials into acc and returns True (it stores the tile)."""
        c = self.cfg
        tile_elems = c.bm * c.bn
        per_thread = cute.size(acc)
        nthr = 128 * c.n_mma_wg
        # partial layout: [tile][slice][element index in the thread's fragment][thread] (coalesced)
        base = (t * c.split_k + ks) * tile_elems
        for i in cutlass.range_constexpr(per_thread):
            mWork[base + i * nthr + mtid] = acc[i]
        cute.arch.fence_acq_rel_gpu()
        epi_bar.arrive_and_wait()
        if mtid == 0:
            old = cute.arch.atomic_add(mCount.iterator + t, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            is_last = old == c.split_k - 1
            flag[0] = cutlass.Int32(1) if is_last else cutlass.Int32(0)
            if is_last:
                mCount[t] = cutlass.Int32(0)
        epi_bar.arrive_and_wait()
        last = flag[0] != 0
        if last:
            cute.arch.fence_acq_rel_gpu()
            for s in cutlass.range(c.split_k, unroll=1):
                if s != ks:
                    ob = (t * c.split_k + s) * tile_elems
                    for i in cutlass.range_constexpr(per_thread):
                        acc[i] = acc[i] + mWork[ob + i * nthr + mtid]
        epi_bar.arrive_and_wait()
        return last
