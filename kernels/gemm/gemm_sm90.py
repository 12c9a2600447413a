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
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
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
    pingpong: bool = False  # two promotion temporaries per warpgroup (ptxas serializes it: C7514)
    stagger: bool = True  # bm = 128: warpgroup 1 starts each tile one K block after warpgroup 0

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


@dsl_user_op
def _keep(x: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """x through an empty volatile asm: the value is read and re-defined at this program point."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [x.ir_value(loc=loc, ip=ip)], "", "=r,0", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@cute.jit
def _fence_regs(frag: cute.Tensor):
    """Pin an accumulator fragment at this point (CUTLASS's warpgroup_fence_operand). The wgmma
    results are SSA values, so without it the compiler may hoist the promotion's reads of a
    temporary above the wgmma wait, or sink them below the next wgmma that overwrites it, and
    ptxas then serializes every wgmma of the kernel (C7514)."""
    words = cute.recast_tensor(frag, cutlass.Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = _keep(words[i])


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
        mWork: cute.Tensor,  # split-K: (tiles * bm * bn,) fp32 tile sums, zero between calls; else unused
        mCount: cute.Tensor,  # split-K: (tiles,) int32 arrival counters, zero between calls
        n_ctas: cutlass.Int32,  # persistent grid size (the SM count)
        stream: cuda.CUstream,
    ):
        c = self.cfg
        S = c.n_stages
        fp8 = mA.element_type
        def make_mma():
            return sm90_utils.make_trivial_tiled_mma(
                fp8, mB.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (c.n_mma_wg, 1, 1), (64, c.bn),
            )

        # two copies of the MMA: the first k-step of a block overwrites (ACCUMULATE off), the rest
        # accumulate; each is set once at kernel entry (toggling one MMA inside the loops makes a
        # value that does not dominate its later uses)
        tiled_mma, mma_acc = make_mma(), make_mma()
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
            tma_a, gA_t, tma_b, gB_t, tma_c, gC_t, mSA, mSB, mWork, mCount, tiled_mma, mma_acc,
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
        mma_acc: cute.TiledMma,
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
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        mmas = (tiled_mma, mma_acc)

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
            tmp2 = cute.make_rmem_tensor(acc_shape, cutlass.Float32) if c.pingpong else tmp
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

            g_rd = cutlass.Int32(0)  # K blocks this CTA has waited for / released (ring position)
            g_rel = cutlass.Int32(0)
            flag = st.flag.get_tensor(cute.make_layout((4,)))
            slices_done = cutlass.Int32(0)
            for u in cutlass.range(bidx, units, gdim, unroll=1):
                tm, tn, ks, t = self._tile_of(u, tiles_m, tiles_n)
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                sb_row = (tn * c.bn) // KBLOCK
                # the two (or 2*M) rows this thread accumulates, clamped into [0, M) for the scale loads
                acc.fill(0.0)
                rows = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
                for r in cutlass.range_constexpr(n_rows):
                    rows[r] = cutlass.min(tm * c.bm + cC_mn[r, 0][0], m_size - 1)
                if cutlass.const_expr(c.pingpong):
                    g_rd, g_rel = self._mainloop_pingpong(
                        ring, mmas, tCrA, tCrB, acc_mn, tmp, tmp2, mSA, mSB, rows, sb_row, kb0, kb1, g_rd, g_rel)
                else:
                    g_rd = self._mainloop_serial(ring, mmas, tCrA, tCrB, acc_mn, tmp, mSA, mSB, rows, sb_row,
                                                 kb0, kb1, g_rd, wg - 1)
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


    # ---------------- mainloops (consumer warpgroups) ----------------
    def _state(self, g):
        S = self.cfg.n_stages
        return pipeline.PipelineState(S, g, g % S, (g // S) % 2)

    @cute.jit
    def _issue(self, mmas, tmp, tCrA, tCrB, stage):
        """The 4 wgmma (k = 32 each) of one 128-wide K block into tmp (overwritten), one group."""
        _fence_regs(tmp)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mmas[0] if k == 0 else mmas[1], tmp, tCrA[(None, None, k, stage)],
                      tCrB[(None, None, k, stage)], tmp)
        warpgroup.commit_group()

    @cute.jit
    def _load_scales(self, sc, mSA, mSB, rows, sb_row, kb):
        """sc[r] = sa[row r, kb] * sw[n block, kb] (global loads; consumed one K block later)."""
        sw = mSB[sb_row, kb]
        for r in cutlass.range_constexpr(cute.size(sc)):
            sc[r] = mSA[rows[r], kb] * sw

    @cute.jit
    def _promote(self, acc_mn, tmp, sc):
        _fence_regs(tmp)  # after the wgmma wait that completed tmp
        tmp_mn = _mn_view(tmp)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            for cc in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * sc[r]

    @cute.jit
    def _mainloop_serial(self, ring, mmas, tCrA, tCrB, acc_mn, tmp, mSA, mSB, rows, sb_row, kb0, kb1, g_rd, wgc):
        """Per K block: wait -> 4 wgmma -> wait_group(0) -> release -> promote. The tensor core idles
        while a warpgroup promotes unless the other warpgroup's wgmmas fill it; two warpgroups that
        wait for the same stages run in lockstep and promote at the same time. `stagger`: warpgroup
        1 starts each tile only once warpgroup 0's first block is done (a named barrier), so one
        promotes while the other's wgmmas run (the epilogue barrier re-aligns them every tile)."""
        c = self.cfg
        stagger = c.stagger and c.n_mma_wg == 2
        n_rows = cute.size(rows)
        sc = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        nxt = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        self._load_scales(nxt, mSA, mSB, rows, sb_row, kb0)
        for kb in cutlass.range(kb0, kb1, unroll=1):
            for r in cutlass.range_constexpr(n_rows):
                sc[r] = nxt[r]
            self._load_scales(nxt, mSA, mSB, rows, sb_row, cutlass.min(kb + 1, kb1 - 1))
            st = self._state(g_rd)
            if cutlass.const_expr(stagger):
                if kb == kb0 and wgc == 1:
                    cute.arch.barrier(barrier_id=2, number_of_threads=256)
            ring.consumer_wait(st)
            self._issue(mmas, tmp, tCrA, tCrB, st.index)
            warpgroup.wait_group(0)
            if cutlass.const_expr(stagger):
                if kb == kb0 and wgc == 0:
                    cute.arch.barrier_arrive(barrier_id=2, number_of_threads=256)
            ring.consumer_release(st)
            g_rd = g_rd + 1
            self._promote(acc_mn, tmp, sc)
        return g_rd

    @cute.jit
    def _mainloop_pingpong(self, ring, mmas, tCrA, tCrB, acc_mn, tA, tB, mSA, mSB, rows, sb_row, kb0, kb1,
                           g_rd, g_rel):
        """v2: two temporaries. K block j+1's wgmmas are queued (into the other temporary) before block
        j is promoted, so the tensor core always holds this warpgroup's next group while it promotes.
        Blocks go A, B, A, B, ...; with n blocks the loop runs n // 2 pairs. For even n the last A
        issue is a phantom (block n does not exist): it re-reads the stage of block n - 1 (still
        held), takes no ring slot and is never promoted -- no wgmma sits under a runtime branch
        (docs/lessons/fmha.md 13), only the ring wait and the promotion do."""
        n_rows = cute.size(rows)
        n = kb1 - kb0
        scA = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        scB = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        self._load_scales(scA, mSA, mSB, rows, sb_row, kb0)
        st = self._state(g_rd)
        ring.consumer_wait(st)
        self._issue(mmas, tA, tCrA, tCrB, st.index)
        g_rd = g_rd + 1
        for p in cutlass.range(n // 2, unroll=1):
            b1 = kb0 + 2 * p + 1  # always a real block
            self._load_scales(scB, mSA, mSB, rows, sb_row, b1)
            st1 = self._state(g_rd)
            ring.consumer_wait(st1)
            self._issue(mmas, tB, tCrA, tCrB, st1.index)
            g_rd = g_rd + 1
            warpgroup.wait_group(1)
            ring.consumer_release(self._state(g_rel))
            g_rel = g_rel + 1
            self._promote(acc_mn, tA, scA)
            b2 = b1 + 1
            real = b2 < kb1
            self._load_scales(scA, mSA, mSB, rows, sb_row, cutlass.min(b2, kb1 - 1))
            st2 = self._state(g_rd)
            if real:
                ring.consumer_wait(st2)
            stage2 = st2.index if real else st1.index
            self._issue(mmas, tA, tCrA, tCrB, stage2)
            g_rd = g_rd + (1 if real else 0)
            warpgroup.wait_group(1)
            ring.consumer_release(self._state(g_rel))
            g_rel = g_rel + 1
            self._promote(acc_mn, tB, scB)
        warpgroup.wait_group(0)
        if n % 2 == 1:
            ring.consumer_release(self._state(g_rel))
            g_rel = g_rel + 1
            self._promote(acc_mn, tA, scA)
        return g_rd, g_rel

    @cute.jit
    def _split_k_merge(self, acc, mWork, mCount, flag, epi_bar, t, ks, mtid) -> cutlass.Boolean:
        """Split-K fix-up: every slice adds its fp32 partial into the tile's zeroed workspace with
        red.global.add (fire and forget), then counts itself in; the last slice to arrive reads the
        sum back (one pass, every load in flight at once), zeroes the workspace and the counter for
        the next call, and returns True (it stores the tile). Addition order varies run to run."""
        c = self.cfg
        per_thread = cute.size(acc)
        nthr = 128 * c.n_mma_wg
        # workspace layout: [tile][element of the thread's fragment][thread] (coalesced)
        base = t * (c.bm * c.bn) + mtid
        for i in cutlass.range_constexpr(per_thread):
            cute.arch.red(mWork.iterator + (base + i * nthr), acc[i], op="add", dtype=cutlass.Float32,
                          sem="relaxed", scope="gpu")
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
            for i in cutlass.range_constexpr(per_thread):
                acc[i] = mWork[base + i * nthr]
            for i in cutlass.range_constexpr(per_thread):
                mWork[base + i * nthr] = cutlass.Float32(0.0)
        epi_bar.arrive_and_wait()
        return last
