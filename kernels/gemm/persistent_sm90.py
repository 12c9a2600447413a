"""What the two SM90 GEMM kernels share (gemm_sm90.py: FP8 block-scaled; bf16_sm90.py: bf16): one
persistent CTA per SM dealt work units (tile, K slice) round-robin, the shared-memory stage ring
that warp 0 of warpgroup 0 fills by TMA, the consumer warpgroups' wgmma fragments of the stages,
and the split-K fix-up. Each kernel keeps its own launch, operand layouts, TMA copies, mainloop and
epilogue.

These are the FP8 kernel's expressions, moved in the order it ran them: a textual change of its
index arithmetic once cost 20-25% on the H100 with SASS equal up to register names
(docs/lessons/gemm.md 8), so the move was checked by the cubin of every configuration both kernels
compile, byte-identical before and after.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass.pipeline import pipeline_init_arrive

from kernels.gemm.tiling import SMEM_BYTES
from kernels.rings import tma_ring


def tma_slices(atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor):
    """The (stage buffers, global tiles) TMA partition of one operand: modes 0-1 of both are one box;
    the CTA loads whole boxes (one CTA in the atom's layout, a multicast included)."""
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                                 cute.group_modes(gmem, 0, 2))


def tile_sum_rows(cfg) -> int:
    """Rows of a tile's fp32 sum in the split-K workspace: the accumulators' (a 16 / 32-row x tile
    keeps the m64 wgmma's 64)."""
    return max(cfg.bm, 64)


class PersistentGemmSm90:
    """Base of the two kernels. cfg (GemmConfig or Bf16Config) gives bm, bn, group_m, split_k,
    n_stages, stage_bytes, n_mma_wg and reg_split."""

    def __init__(self, cfg):
        self.cfg = cfg

    def _storage(self, **buffers):
        """The kernel's shared storage: the ring's full and empty barriers, the split-K flag, then
        `buffers` in order (name=(dtype, layout, alignment): cosize(layout) elements). The stage
        count comes from an estimate (cfg.n_stages); the compile proves the storage fits."""
        fields = {"bars": cute.struct.MemRange[cutlass.Int64, self.cfg.n_stages * 2],
                  "flag": cute.struct.MemRange[cutlass.Int32, 4]}
        for name, (dtype, layout, align) in buffers.items():
            fields[name] = cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], align]

        class Storage:  # fields given as objects (this module's annotations are strings)
            __annotations__ = fields

        Storage = cute.struct(Storage)
        if Storage.size_in_bytes() > SMEM_BYTES:
            raise ValueError(f"{self.cfg}: {Storage.size_in_bytes()} B of shared memory, more than {SMEM_BYTES}")
        return Storage

    def _grid(self, mA, mB, n_ctas, cluster_n: int = 1):
        """The persistent grid of x mA (M rows) and W mB (N rows): a CTA per SM (n_ctas), at most
        one per work unit; cluster_n > 1: whole clusters, each stepping over cluster_n N tiles."""
        c = self.cfg
        m = cute.size(mA, mode=[0])
        n = cute.size(mB, mode=[0])
        pairs_n = ((n + c.bn - 1) // c.bn + cluster_n - 1) // cluster_n  # N tiles per cluster step
        units = ((m + c.bm - 1) // c.bm) * pairs_n * c.split_k
        return cutlass.min(units, n_ctas // cluster_n) * cluster_n

    def _stages(self, Storage, sA_layout, sB_layout, cluster_n: int = 1):
        """Kernel entry: the shared storage (fields bars, sA, sB and the kernel's own), the TMA ring
        over its stages (initialisation deferred: the caller waits with pipeline_init_wait) and the
        A and B stage tensors. cluster_n > 1: the ring of a CTA in a (1 x cluster_n) cluster."""
        c = self.cfg
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        ring = tma_ring(st.bars.data_ptr(), c.n_stages, c.n_mma_wg * 4, c.stage_bytes, cluster_n=cluster_n)
        pipeline_init_arrive(cluster_shape_mn=(1, cluster_n), is_relaxed=True)
        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        return st, ring, sA, sB

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

    @cute.jit
    def _produce(self, warp_idx, ring, step0, units, steps, tiles_m, tiles_n, kb_per, n_kb, locate, load):
        """Warpgroup 0 gives its registers up; its warp 0 walks the units step0, step0 + steps, ...
        and fills one stage per K block of the unit's slice: `where = locate(m tile, n tile)` once
        per unit (where its operands lie), `load(where, kb, state, bar)` issues the stage's TMA
        copies on its full barrier `bar`."""
        c = self.cfg
        cute.arch.setmaxregister_decrease(c.reg_split[0])
        if warp_idx == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, c.n_stages)
            for u in cutlass.range(step0, units, steps, unroll=1):
                tm, tn, ks, _t = self._tile_of(u, tiles_m, tiles_n)
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                where = locate(tm, tn)
                for kb in cutlass.range(kb0, kb1, unroll=c.unroll):
                    ring.producer_acquire(state)
                    bar = ring.producer_get_barrier(state)
                    load(where, kb, state, bar)
                    ring.producer_commit(state)
                    state.advance()
            ring.producer_tail(state)

    def _consumer(self, tiled_mma, sA, sB, tidx):
        """A consumer warpgroup's entry: it takes the registers warpgroup 0 gave up. Returns its
        thread index among the consumers, its MMA slice and its wgmma fragments of the stages."""
        cute.arch.setmaxregister_increase(self.cfg.reg_split[1])
        mtid = tidx - 128
        thr_mma = tiled_mma.get_slice(mtid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        return mtid, thr_mma, tCrA, tCrB

    def _tile_done(self, acc, mWork, mCount, flag, epi_bar, t, mtid):
        """Whether this unit stores its tile: always without split-K; else after `_split_k_merge`,
        the last slice to arrive (acc then holds the tile's sum)."""
        if self.cfg.split_k == 1:
            return True
        return self._split_k_merge(acc, mWork, mCount, flag, epi_bar, t, mtid)

    @cute.jit
    def _split_k_merge(self, acc, mWork, mCount, flag, epi_bar, t, mtid) -> cutlass.Boolean:
        """Split-K fix-up: every slice adds its fp32 partial into the tile's zeroed workspace with
        red.global.add (fire and forget), then counts itself in; the last slice to arrive reads the
        sum back (one pass, every load in flight at once), zeroes the workspace and the counter for
        the next call, and returns True (it stores the tile). Addition order varies run to run."""
        c = self.cfg
        per_thread = cute.size(acc)
        nthr = 128 * c.n_mma_wg
        # workspace layout: [tile][element of the thread's fragment][thread] (coalesced); a small x
        # tile (bm 16 / 32) keeps the m64 fragment, whose warps past bm / 16 hold no row of the tile
        base = t * (tile_sum_rows(c) * c.bn) + mtid
        holds_rows = True
        if cutlass.const_expr(c.bm < 64):
            holds_rows = mtid // 32 < c.bm // 16
        if holds_rows:
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
        if last and holds_rows:
            cute.arch.fence_acq_rel_gpu()
            for i in cutlass.range_constexpr(per_thread):
                acc[i] = mWork[base + i * nthr]
            for i in cutlass.range_constexpr(per_thread):
                mWork[base + i * nthr] = cutlass.Float32(0.0)
        epi_bar.arrive_and_wait()
        return last
