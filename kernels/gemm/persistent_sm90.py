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
from kernels.split_merge import add_and_count


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
        if self.cfg.cluster_k:  # the split-K cluster's merge: its mbarrier and the partials it counts
            fields["merge_bar"] = cute.struct.MemRange[cutlass.Int64, 1]
            fields["parts"] = cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.cfg.partial_floats], 16]
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
        if cutlass.const_expr(c.cluster_k):  # whole clusters of a tile's slices (run_gemm: one round)
            return cutlass.min(units, n_ctas // c.split_k * c.split_k)
        return cutlass.min(units, n_ctas // cluster_n) * cluster_n

    def _stages(self, Storage, sA_layout, sB_layout, cluster_n: int = 1):
        """Kernel entry: the shared storage (fields bars, sA, sB and the kernel's own), the TMA ring
        over its stages (initialisation deferred: the caller waits with pipeline_init_wait) and the
        A and B stage tensors. cluster_n > 1: the ring of a CTA in a (1 x cluster_n) cluster."""
        c = self.cfg
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        ring = tma_ring(st.bars.data_ptr(), c.n_stages, c.n_mma_wg * 4, c.stage_bytes, cluster_n=cluster_n)
        if c.cluster_k:  # the cluster-wide arrive below publishes the init before any slice can send
            self._init_merge_bar(st.merge_bar.data_ptr())
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape(cluster_n), is_relaxed=True)
        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        return st, ring, sA, sB

    @cute.jit
    def _init_merge_bar(self, bar):
        """One arrive completes a split-K cluster's merge phase: the first slice's, with the partials' bytes."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.mbarrier_init(bar, 1)

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
    def _produce(self, warp_idx, ring, step0, units, steps, tiles_m, tiles_n, kb_per, n_kb, locate, load,
                 load_x=None):
        """Warpgroup 0 gives its registers up; its warp 0 walks the units step0, step0 + steps, ...
        and fills one stage per K block of the unit's slice: `where = locate(m tile, n tile)` once
        per unit (where its operands lie), `load(where, kb, state, bar)` issues the stage's TMA
        copies on its full barrier `bar`. With `load_x` (a kernel launched with programmatic
        dependent launch): `load` issues the weight's copies only and `load_x` the activation's, and
        the first unit's first ring-full of weights is loaded before `griddepcontrol.wait`."""
        c = self.cfg
        cute.arch.setmaxregister_decrease(c.reg_split[0])
        if warp_idx == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, c.n_stages)
            early = 0
            if cutlass.const_expr(load_x is not None):
                # the state comes back: a dynamic loop rebinds its carried names in the helper's scope only
                early, state = self._weights_before_wait(ring, state, step0, tiles_m, tiles_n, kb_per, n_kb, locate,
                                                         load, load_x)
            for u in cutlass.range(step0, units, steps, unroll=1):
                tm, tn, ks, _t = self._tile_of(u, tiles_m, tiles_n)
                kb0 = ks * kb_per
                kb1 = cutlass.min(kb0 + kb_per, n_kb)
                where = locate(tm, tn)
                start = kb0
                if cutlass.const_expr(load_x is not None):
                    start = kb0 + cutlass.select_(u == step0, early, 0)  # those went before the wait
                for kb in cutlass.range(start, kb1, unroll=c.unroll):
                    ring.producer_acquire(state)
                    bar = ring.producer_get_barrier(state)
                    load(where, kb, state, bar)
                    if cutlass.const_expr(load_x is not None):
                        load_x(where, kb, state, bar)
                    ring.producer_commit(state)
                    state.advance()
            ring.producer_tail(state)

    @cute.jit
    def _weights_before_wait(self, ring, state, step0, tiles_m, tiles_n, kb_per, n_kb, locate, load_w, load_x):
        """PDL: the weight copies of the first unit's first K blocks (up to a ring-full: every stage is
        free) go out while the previous kernel may still run; then `griddepcontrol.wait` (the previous
        grid done, its writes visible) and those stages' activation copies on the same full barriers.
        Every CTA of the grid has a first unit. Returns how many K blocks went so and the state past them (the
        caller's `state` object is not advanced: docs/lessons/gemm.md 17)."""
        c = self.cfg
        tm, tn, ks, _t = self._tile_of(step0, tiles_m, tiles_n)
        kb0 = ks * kb_per
        early = cutlass.max(cutlass.min(cutlass.min(kb0 + kb_per, n_kb) - kb0, c.n_stages), 0)
        where = locate(tm, tn)
        for i in cutlass.range(early, unroll=1):
            ring.producer_acquire(state)
            load_w(where, kb0 + i, state, ring.producer_get_barrier(state))
            ring.producer_commit(state)
            state.advance()
        cute.arch.griddepcontrol_wait()
        again = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, c.n_stages)  # the same stages
        for i in cutlass.range(early, unroll=1):
            load_x(where, kb0 + i, again, ring.producer_get_barrier(again))
            again.advance()
        return early, state

    def _consumer(self, tiled_mma, sA, sB, tidx):
        """A consumer warpgroup's entry: it takes the registers warpgroup 0 gave up. Returns its
        thread index among the consumers, its MMA slice and its wgmma fragments of the stages."""
        cute.arch.setmaxregister_increase(self.cfg.reg_split[1])
        mtid = tidx - 128
        thr_mma = tiled_mma.get_slice(mtid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        return mtid, thr_mma, tCrA, tCrB

    def cluster_shape(self, cluster_n: int = 1) -> tuple[int, int]:
        """The (m, n) cluster shape the pipeline init syncs over: a split-K cluster's slices, or a pair."""
        return (self.cfg.split_k, 1) if self.cfg.cluster_k else (1, cluster_n)

    def _tile_done(self, acc, mWork, mCount, flag, epi_bar, t, mtid, st=None, ks=None):
        """Whether this unit stores its tile: always without split-K; else after the merge (acc then
        holds the tile's sum): `_cluster_merge`'s first slice, or `_split_k_merge`'s last to arrive."""
        if self.cfg.split_k == 1:
            return True
        if self.cfg.cluster_k:
            return self._cluster_merge(acc, st, ks, mtid)
        return self._split_k_merge(acc, mWork, mCount, flag, epi_bar, t, mtid)

    def _holds_rows(self, mtid):
        """Whether consumer thread mtid holds rows of the tile: a small x tile (bm 16 / 32) keeps the m64
        fragment, whose warps past bm / 16 hold none."""
        if cutlass.const_expr(self.cfg.bm < 64):
            return mtid // 32 < self.cfg.bm // 16
        return True

    @cute.jit
    def _cluster_merge(self, acc, st, ks, mtid) -> cutlass.Boolean:
        """Split-K fix-up inside a cluster (GemmConfig.cluster_k): slice ks > 0 sends the fp32 partial
        its threads hold into slot ks - 1 of the first slice's shared memory (st.async.shared::cluster,
        16 bytes a store, each completing its bytes on the first slice's merge barrier) and is done;
        the first slice arms that barrier with all the slots' bytes, waits for them and adds them in
        slot order (the same order every run). Slot layout [4-value group][thread][4] (coalesced)."""
        c = self.cfg
        per_thread = cute.size(acc)
        holders = c.bm * c.bn // per_thread  # threads holding rows of the tile (a 16 / 32-row x tile: bm / 16 warps)
        slot = c.bm * c.bn
        holds_rows = self._holds_rows(mtid)
        bar = st.merge_bar.data_ptr()
        parts = st.parts.get_tensor(cute.make_layout((c.partial_floats,)))
        first = ks == 0
        if first:
            if mtid == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bar, c.partial_floats * 4)
            cute.arch.mbarrier_wait(bar, 0)
            if holds_rows:
                for s in cutlass.range_constexpr(c.split_k - 1):
                    for i in cutlass.range_constexpr(per_thread):
                        acc[i] = acc[i] + parts[s * slot + (i // 4) * holders * 4 + mtid * 4 + i % 4]
        elif holds_rows:
            words = cute.recast_tensor(acc, cutlass.Int32)
            base = (ks - 1) * slot + mtid * 4
            for g in cutlass.range_constexpr(per_thread // 4):
                dst = parts.iterator + cute.assume(base + g * holders * 4, divby=4)  # 16-byte stores
                cute.arch.store_async_dsmem(dst, (words[4 * g], words[4 * g + 1], words[4 * g + 2], words[4 * g + 3]),
                                            bar, 0)
        return first

    @cute.jit
    def _split_k_merge(self, acc, mWork, mCount, flag, epi_bar, t, mtid) -> cutlass.Boolean:
        """Split-K fix-up through the global workspace (kernels/split_merge.add_and_count): True on the last
        slice to arrive, whose acc then holds the tile's sum (it stores the tile)."""
        c = self.cfg
        nthr = 128 * c.n_mma_wg
        base = t * (tile_sum_rows(c) * c.bn) + mtid  # workspace layout: [tile][element of the fragment][thread]
        return add_and_count([acc], mWork, mCount, flag, epi_bar, t, base, nthr, c.split_k, mtid,
                             self._holds_rows(mtid))
