"""SM90 lightning-indexer logits (spec §6), DeepGEMM's `fp8_mqa_logits` contract:

    logits[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . kv[s, :]) * sc[s]   for ks[t] <= s < ke[t]
    logits[t, s] = -inf                                                    elsewhere (s < S_kv)

q FP8 e4m3 [T, 64, 128] (viewed as [T*64, 128]), kv FP8 e4m3 [S_kv, 128] with one fp32 scale per key
`sc` [S_kv], w fp32 [T, 64], ks / ke int32 [T] (per-query [start, end) key ranges; the DSV4 causal
mask s < floor((t+1)/4) is ks = 0, ke = floor((t+1)/4)), logits fp32 [T, S_kv] (any row stride).
ReLU(x * sc) = ReLU(x) * sc needs sc >= 0 (a quantisation scale is); the scale is applied after
the head sum, as DeepGEMM does.

Operands are swapped with respect to the math (as in DeepGEMM): the wgmma's A (M side) is the key
tile, B (N side) is the query block, so one warpgroup's accumulator is (64 keys) x (bq tokens x 64
heads) and the head sum runs along N: within a thread (16 of a token's 64 heads per thread) and
then over the 4 lanes of a quad, transposed (`_quad_sum`: each lane ends with whole sums of its
own key row and token). No cross-warp reduction, no shared memory in the epilogue. The key scale
is per accumulator row (a lane reads its own row's), the head weight per column (bq * 16 values per
thread, loaded once per query block).

Structure (one CTA per SM, persistent; units dealt round-robin):
  * unit u = (query block qb, key part p): the block's bq tokens and one of `n_split` contiguous
    parts of its key-tile range [floor(min ks / bk), ceil(max ke / bk)). Blocks are dealt last
    first (under the causal mask the late blocks have the most keys: longest first).
  * warpgroup 0, warp 0: TMA producer. Per unit with tiles: the (bq*64 x 128) query tile and the
    (bq x 64) weight box into a 2-stage Q ring; per key tile the (bk x 128) key tile and its bk
    scales into a `stages`-deep KV ring (PipelineTmaAsync). Rows past T*64 / S_kv are zero-filled.
  * warpgroup 0, warps 1-3: write -inf over the columns of the unit's rows that no key tile covers
    (left of the first tile, right of the last), for part 0 only. They are otherwise idle, so the
    masked half of a causal output costs no consumer time.
  * consumer warpgroups (n_wg of them, 1-4), in groups of tile_wgs (`LogitsConfig.mma_wg`) that
    share a key tile of bk = 64 * tile_wgs keys, 64 rows each; with more than one group, the CTA's
    g-th tile belongs to group g % groups and the groups run free of each other (their epilogues
    fall under the others' wgmmas as the warp schedulers interleave them: DeepGEMM's four
    cooperative warpgroups of 112 registers get the same overlap from occupancy). Per key tile:
    wait -> read the lane's key scale from shared memory -> 4 wgmma (m64 n{64*bq} k32, fp8) ->
    wait -> release the stage -> epilogue: ReLU, x w, head sum (thread, then quad), x key scale,
    -inf outside [ks, ke) by a select, one predicated st.global a lane, no branches (8 lanes of a
    warp cover 8 consecutive keys of one row: 32-byte segments). With `overlap`, two tiles are in
    flight per warpgroup (`_tiles_overlapped`). Shipped (kernels/indexer/config.py): two groups of
    one warpgroup, two tiles in flight each.
  * ping-pong (`pingpong`, a declared variant): two groups of one warpgroup (64-key stages) that
    take turns to issue their wgmmas (named barriers BAR_TURN0 + w, FA3's schedule as in
    kernels/fmha/pingpong.py), so one warpgroup's epilogue runs under the other's wgmmas.
    Warpgroups sharing every stage fall into step (docs/lessons/fmha.md 17): the tensor core then
    idles during epilogues.
Every element of [T, S_kv] is written exactly once (by the fill warps or by one consumer lane).

K = 128 is one wgmma K block: no promotion; the wgmma accumulates in fp32.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from kernels.indexer.logits_config import HEAD_DIM, HEADS, SMEM_BYTES, LogitsConfig
from kernels.indexer.logits_epilogue import LogitsEpilogue
from kernels.regs import fence_operand, mn_view
from kernels.rings import tma_ring

FILL_THREADS = 96  # warps 1-3 of the producer warpgroup
BAR_TURN0 = 1  # ping-pong: named barrier BAR_TURN0 + w opens consumer warpgroup w's turn (1, 2)


class IndexerLogitsSm90(LogitsEpilogue):
    scratch_words = 0  # shared Int32 words of the storage's `scratch` field (none here)

    def __init__(self, cfg: LogitsConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (T*64, 128) fp8 e4m3: q[t, h, :] at row t*64 + h
        mKV: cute.Tensor,  # (S_kv, 128) fp8 e4m3, d contiguous, rows 16-byte aligned
        mSc: cute.Tensor,  # (S_kv,) fp32 key scales
        mW: cute.Tensor,  # (T, 64) fp32 head weights
        mKs: cute.Tensor,  # (T,) int32 first visible key
        mKe: cute.Tensor,  # (T,) int32 one past the last visible key
        mL: cute.Tensor,  # (T, S_kv) fp32 logits, row stride >= S_kv
        n_split: cutlass.Int32,  # key parts per query block (fills the SMs when T is small)
        n_ctas: cutlass.Int32,  # persistent grid size (the SM count)
        stream: cuda.CUstream,
    ):
        c = self.cfg
        ops = self._operands(mQ, mKV, mSc, mW)
        n_tok = cute.size(mW, mode=[0])
        units = ((n_tok + c.bq - 1) // c.bq) * n_split
        grid = cutlass.min(units, n_ctas)
        self.kernel(*ops[:8], mKs, mKe, mL, n_split, *ops[8:]).launch(
            grid=(grid, 1, 1), block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    def _operands(self, mQ, mKV, mSc, mW):
        """Trace-time setup shared with the paged decode kernel (kernels/indexer/decode_sm90.py): the
        two MMAs, the shared-memory layouts, the TMA atoms of the keys (bk x 128 tiles of mKV), their
        scales (bk of mSc), the queries (n x 128 of mQ) and the weights (bq x 64 of mW), and the
        shared storage. Returns the atoms with their TMA tensors, then the MMAs, layouts, Storage."""
        c = self.cfg
        S = c.n_stages
        fp8 = mQ.element_type

        def make_mma():
            return sm90_utils.make_trivial_tiled_mma(
                fp8, mKV.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (c.mma_wg, 1, 1), (64, c.n),
            )

        # two copies of the MMA: the first k-step overwrites (ACCUMULATE off), the rest accumulate;
        # each set once at kernel entry (as in kernels/gemm/gemm_sm90.py)
        tiled_mma, mma_acc = make_mma(), make_mma()
        tile = (c.bk, c.n, HEAD_DIM)
        sK_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, mKV.element_type, S)
        sQ_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, fp8, c.q_stages)
        # key scales and head weights ride with their stages (a TMA destination is 128-byte
        # aligned: bk * 4 and bq * 256 bytes are multiples of 128)
        sSc_layout = cute.make_layout((c.bk, S), stride=(1, c.bk))
        sW_layout = cute.make_layout((c.bq, HEADS, c.q_stages), stride=(HEADS, 1, c.bq * HEADS))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_k, gK_t = cpasync.make_tiled_tma_atom(g2s, mKV, cute.slice_(sK_layout, (None, None, 0)), (c.bk, HEAD_DIM))
        tma_q, gQ_t = cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (c.n, HEAD_DIM))
        tma_sc, gSc_t = cpasync.make_tiled_tma_atom(g2s, mSc, cute.slice_(sSc_layout, (None, 0)), (c.bk,))
        tma_w, gW_t = cpasync.make_tiled_tma_atom(g2s, mW, cute.slice_(sW_layout, (None, None, 0)), (c.bq, HEADS))

        fields = {
            "kv_bars": cute.struct.MemRange[cutlass.Int64, S * 2],
            "q_bars": cute.struct.MemRange[cutlass.Int64, c.q_stages * 2],
            "sSc": cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(sSc_layout)], 128],
            "sW": cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(sW_layout)], 128],
            "sK": cute.struct.Align[cute.struct.MemRange[mKV.element_type, cute.cosize(sK_layout)], 1024],
            "sQ": cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(sQ_layout)], 1024],
        }
        if self.scratch_words:  # Int32 words a subclass's epilogue shares across warps
            fields["scratch"] = cute.struct.Align[cute.struct.MemRange[cutlass.Int32, self.scratch_words], 16]

        class Storage:  # fields given as objects (this module's annotations are strings)
            __annotations__ = fields

        Storage = cute.struct(Storage)

        # the stage count comes from an estimate (LogitsConfig.n_stages); the compile proves it fits
        if cutlass.const_expr(Storage.size_in_bytes() > SMEM_BYTES):
            raise ValueError(f"{c}: {Storage.size_in_bytes()} B of shared memory, more than {SMEM_BYTES}")

        return (tma_k, gK_t, tma_q, gQ_t, tma_sc, gSc_t, tma_w, gW_t,
                tiled_mma, mma_acc, sK_layout, sQ_layout, sSc_layout, sW_layout, Storage)

    @cute.kernel
    def kernel(
        self,
        tma_k: cute.CopyAtom,
        gK_t: cute.Tensor,
        tma_q: cute.CopyAtom,
        gQ_t: cute.Tensor,
        tma_sc: cute.CopyAtom,
        gSc_t: cute.Tensor,
        tma_w: cute.CopyAtom,
        gW_t: cute.Tensor,
        mKeys0: cute.Tensor,  # prefill: ks (T,); decode: the lengths (B,)
        mKeys1: cute.Tensor,  # prefill: ke (T,); decode: the block table (B, max_blocks)
        mL: cute.Tensor,
        cut: cutlass.Int32,  # prefill: key parts per query block; decode: pages per CTA
        tiled_mma: cute.TiledMma,
        mma_acc: cute.TiledMma,
        sK_layout: cute.ComposedLayout,
        sQ_layout: cute.ComposedLayout,
        sSc_layout: cute.Layout,
        sW_layout: cute.Layout,
        Storage: cutlass.Constexpr,
    ):
        """The entry of this kernel and of the paged decode kernel (decode_sm90.py), so that the two
        share one parameter list: `_operands`' TMA atoms and tensors, what gives each row of logits its
        keys, the logits, how the work is cut, then `_operands`' MMAs, layouts and storage. Each kernel's
        body is its `_cta`."""
        self._cta(((tma_k, gK_t), (tma_q, gQ_t), (tma_sc, gSc_t), (tma_w, gW_t)), mKeys0, mKeys1, mL, cut,
                  (tiled_mma, mma_acc), (sK_layout, sQ_layout, sSc_layout, sW_layout), Storage)

    @cute.jit
    def _prologue(self, warp_idx, mmas, tma):
        """Kernel entry (shared with the decode kernel): the two MMAs' accumulate flags, and warp 0
        prefetches the TMA descriptors."""
        tiled_mma, mma_acc = mmas
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        if warp_idx == 0:
            for i in cutlass.range_constexpr(len(tma)):
                cpasync.prefetch_descriptor(tma[i][0])

    def _smem(self, Storage, layouts, tma):
        """Kernel-entry setup shared with the decode kernel: the shared storage, the KV and Q rings
        (initialisation deferred: the caller waits with pipeline_init_wait), the stage tensors and
        the TMA partitions of the four operands (tma: their (atom, TMA tensor) pairs), and the storage."""
        c = self.cfg
        S = c.n_stages
        QS = c.q_stages
        sK_layout, sQ_layout, sSc_layout, sW_layout = layouts
        (tma_k, gK_t), (tma_q, gQ_t), (tma_sc, gSc_t), (tma_w, gW_t) = tma
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        kv_ring = tma_ring(st.kv_bars.data_ptr(), S, c.mma_wg * 4, c.kv_stage_bytes)
        q_ring = tma_ring(st.q_bars.data_ptr(), QS, c.n_wg * 4, c.q_stage_bytes)
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sSc = st.sSc.get_tensor(sSc_layout)
        sW = st.sW.get_tensor(sW_layout)

        # (bk, 128, key tiles, 1), (n, 128, query blocks, 1), (bk, key tiles), (bq, 64, query blocks, 1)
        gK = cute.local_tile(gK_t, (c.bk, HEAD_DIM), (None, None))
        gQ = cute.local_tile(gQ_t, (c.n, HEAD_DIM), (None, None))
        gSc = cute.local_tile(gSc_t, (c.bk,), (None,))
        gW = cute.local_tile(gW_t, (c.bq, HEADS), (None, None))
        tKs, tKg = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                         cute.group_modes(gK, 0, 2))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        tScs, tScg = cpasync.tma_partition(tma_sc, 0, cute.make_layout(1), cute.group_modes(sSc, 0, 1),
                                           cute.group_modes(gSc, 0, 1))
        tWs, tWg = cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                         cute.group_modes(gW, 0, 2))
        return kv_ring, q_ring, sK, sQ, sSc, sW, tKs, tKg, tQs, tQg, tScs, tScg, tWs, tWg, st

    @cute.jit
    def _unit(self, u, n_split, q_blocks, mKs, mKe, n_tok, s_kv, tks=None, tke=None):
        """Unit u -> (query block, part, first and last+1 key tile of the block, of the part).
        Every role calls this with the same arguments and gets the same answer. tks / tke (register
        tensors, consumers): the block's ks / ke, loaded here because the tile range consumes them
        at once (a global load still in flight at a wgmma fence stalls it: docs/lessons/gemm.md 5)."""
        c = self.cfg
        blk = u // n_split
        part = u - blk * n_split
        qb = q_blocks - 1 - blk  # last blocks first: under the causal mask they are the longest
        lo = s_kv
        hi = cutlass.Int32(0)
        for j in cutlass.range_constexpr(c.bq):
            t = cutlass.min(qb * c.bq + j, n_tok - 1)  # tokens past T repeat the last (never stored)
            a = mKs[t]
            b = mKe[t]
            if cutlass.const_expr(tks is not None):
                tks[j] = a
                tke[j] = b
            lo = cutlass.min(lo, cutlass.max(a, 0))
            hi = cutlass.max(hi, cutlass.min(b, s_kv))
        tile_lo = lo // c.bk
        n_t = (hi + c.bk - 1) // c.bk - tile_lo
        if hi <= lo:
            n_t = cutlass.Int32(0)
        t0 = tile_lo + (part * n_t) // n_split
        t1 = tile_lo + ((part + 1) * n_t) // n_split
        return qb, part, tile_lo, tile_lo + n_t, t0, t1

    @cute.jit
    def _cta(self, tma, mKs, mKe, mL, n_split, mmas, layouts, Storage):
        """The prefill kernel's body (module docstring: the units, the producer warp, the fill warps,
        the consumers)."""
        c = self.cfg
        S = c.n_stages
        QS = c.q_stages
        (tma_k, _), (tma_q, _), (tma_sc, _), (tma_w, _) = tma
        tiled_mma, mma_acc = mmas
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        self._prologue(warp_idx, mmas, tma)

        kv_ring, q_ring, sK, sQ, sSc, sW, tKs, tKg, tQs, tQg, tScs, tScg, tWs, tWg, _st = self._smem(Storage, layouts,
                                                                                                  tma)

        n_tok = cute.size(mL, mode=[0])
        s_kv = cute.size(mL, mode=[1])
        q_blocks = (n_tok + c.bq - 1) // c.bq
        units = q_blocks * n_split

        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            cute.arch.setmaxregister_decrease(c.reg_split[0])
            if warp_idx == 0:
                # ---------------- producer: one warp issues the TMA loads ----------------
                g_q = cutlass.Int32(0)
                g_kv = cutlass.Int32(0)
                for u in cutlass.range(bidx, units, gdim, unroll=1):
                    qb, _p, _lo, _hi, t0, t1 = self._unit(u, n_split, q_blocks, mKs, mKe, n_tok, s_kv)
                    if t1 > t0:
                        qst = pipeline.PipelineState(QS, g_q, g_q % QS, ((g_q // QS) % 2) ^ 1)
                        q_ring.producer_acquire(qst)
                        bar = q_ring.producer_get_barrier(qst)
                        cute.copy(tma_q, tQg[(None, qb, 0)], tQs[(None, qst.index)], tma_bar_ptr=bar)
                        cute.copy(tma_w, tWg[(None, qb, 0)], tWs[(None, qst.index)], tma_bar_ptr=bar)
                        q_ring.producer_commit(qst)
                        g_q = g_q + 1
                        for kt in cutlass.range(t0, t1, unroll=1):
                            kst = pipeline.PipelineState(S, g_kv, g_kv % S, ((g_kv // S) % 2) ^ 1)
                            kv_ring.producer_acquire(kst)
                            bar = kv_ring.producer_get_barrier(kst)
                            cute.copy(tma_k, tKg[(None, kt, 0)], tKs[(None, kst.index)], tma_bar_ptr=bar)
                            cute.copy(tma_sc, tScg[(None, kt)], tScs[(None, kst.index)], tma_bar_ptr=bar)
                            kv_ring.producer_commit(kst)
                            g_kv = g_kv + 1
                kv_ring.producer_tail(pipeline.PipelineState(S, g_kv, g_kv % S, ((g_kv // S) % 2) ^ 1))
                q_ring.producer_tail(pipeline.PipelineState(QS, g_q, g_q % QS, ((g_q // QS) % 2) ^ 1))
            else:
                # ---------------- warps 1-3: -inf outside the unit's key tiles ----------------
                ftid = tidx - 32
                for u in cutlass.range(bidx, units, gdim, unroll=1):
                    qb, part, lo_t, hi_t, _t0, _t1 = self._unit(u, n_split, q_blocks, mKs, mKe, n_tok, s_kv)
                    if part == 0:
                        a = cutlass.min(lo_t * c.bk, s_kv)
                        b = cutlass.min(hi_t * c.bk, s_kv)
                        if hi_t == lo_t:  # no tile: the whole row, once
                            a = s_kv
                            b = s_kv
                        self._fill(mL, qb, a, b, ftid, n_tok, s_kv)
        else:
            # ---------------- consumers: wgmma + weighted ReLU head sum + store ----------------
            cute.arch.setmaxregister_increase(c.reg_split[1])
            self._consume(kv_ring, q_ring, tiled_mma, mma_acc, sK, sQ, sSc, sW, mKs, mKe, mL, n_split,
                          q_blocks, units, n_tok, s_kv, tidx, bidx, gdim)

    @cute.jit
    def _fill(self, mL, qb, a, b, ftid, n_tok, s_kv):
        """Columns [0, a) and [b, S_kv) of the block's rows <- -inf (coalesced, 96 threads)."""
        c = self.cfg
        ninf = -cutlass.Float32.inf
        for j in cutlass.range_constexpr(c.bq):
            t = qb * c.bq + j
            if t < n_tok:
                for s in cutlass.range(ftid, a, FILL_THREADS, unroll=1):
                    mL[t, s] = ninf
                for s in cutlass.range(b + ftid, s_kv, FILL_THREADS, unroll=1):
                    mL[t, s] = ninf

    @cute.jit
    def _consume(self, kv_ring, q_ring, tiled_mma, mma_acc, sK, sQ, sSc, sW, mKs, mKe, mL, n_split, q_blocks,
                 units, n_tok, s_kv, tidx, bidx, gdim):
        c = self.cfg
        QS = c.q_stages
        mtid = tidx - 128
        cw = cute.arch.make_warp_uniform(mtid // 128)  # consumer warpgroup
        gi = cw // c.mma_wg  # its group (the tiles it takes: module docstring)
        q4 = tidx % 4  # lane within its quad
        tCrA, tCrB, acc, rows, heads = self._fragments(tiled_mma, sK, sQ, mtid)
        n_cols = cute.size(heads)
        wreg = cute.make_rmem_tensor((n_cols,), cutlass.Float32)
        sc = cute.make_rmem_tensor((1,), cutlass.Float32)  # the key scale of this lane's row
        tok = cute.make_rmem_tensor((c.bq,), cutlass.Int32)
        tks = cute.make_rmem_tensor((c.bq,), cutlass.Int32)
        tke = cute.make_rmem_tensor((c.bq,), cutlass.Int32)
        mmas = (tiled_mma, mma_acc)
        acc2, sc2 = None, None
        if cutlass.const_expr(c.overlap):  # the second tile in flight
            acc2 = cute.make_rmem_tensor(acc.layout, cutlass.Float32)
            sc2 = cute.make_rmem_tensor((1,), cutlass.Float32)

        if cutlass.const_expr(c.pingpong):
            if cw == 1:  # warpgroup 0 takes the first turn
                cute.arch.barrier_arrive(barrier_id=BAR_TURN0, number_of_threads=256)
        g_q = cutlass.Int32(0)
        g_kv = cutlass.Int32(0)  # key tiles of this CTA so far (the producer counts alike)
        for u in cutlass.range(bidx, units, gdim, unroll=1):
            qb, _p, _lo, _hi, t0, t1 = self._unit(u, n_split, q_blocks, mKs, mKe, n_tok, s_kv, tks, tke)
            t0 = cute.arch.make_warp_uniform(t0)
            t1 = cute.arch.make_warp_uniform(t1)
            for j in cutlass.range_constexpr(c.bq):
                tok[j] = qb * c.bq + j
            if t1 > t0:
                qst = pipeline.PipelineState(QS, g_q, g_q % QS, (g_q // QS) % 2)
                q_ring.consumer_wait(qst)
                for cc in cutlass.range_constexpr(n_cols):
                    wreg[cc] = sW[cc // 16, heads[cc], qst.index]
                plan = self._lane_plan(mL, tok, tks, tke, rows, q4, n_tok, s_kv)
                # this group's tiles: the unit's tiles whose CTA ordinal g is gi modulo the groups
                first = t0 + (gi + c.groups - g_kv % c.groups) % c.groups
                kst = self._kv_state(g_kv + (first - t0))
                if cutlass.const_expr(c.overlap):
                    self._tiles_overlapped(kv_ring, mmas, (acc, acc2), tCrA, tCrB, qst.index, sSc, (sc, sc2), kst,
                                           first, t1, wreg, plan, q4, cw)
                else:
                    for kt in cutlass.range(first, t1, c.groups, unroll=1):
                        self._tile(kv_ring, mmas, acc, tCrA, tCrB, qst.index, sSc, sc, kst, kt, wreg, plan, q4, cw)
                        kst = self._step(kst, c.groups)
                g_kv = g_kv + (t1 - t0)
                q_ring.consumer_release(qst)
                g_q = g_q + 1
        if cutlass.const_expr(c.pingpong):
            if g_kv % 2 == cw:  # pairs the arrive of the CTA's last tile (or the opening one)
                cute.arch.barrier(barrier_id=BAR_TURN0 + cw, number_of_threads=256)

    def _kv_state(self, g):
        """The KV ring's consumer state of the CTA's g-th key tile (one division: once a unit)."""
        S = self.cfg.n_stages
        return pipeline.PipelineState(S, g, g % S, (g // S) % 2)

    def _step(self, st, n: int):
        """st advanced by n <= stages tiles: one compare and two selects, no division."""
        S = self.cfg.n_stages
        idx = st.index + n
        wrap = idx >= S
        return pipeline.PipelineState(S, st.count + n, cutlass.select_(wrap, idx - S, idx),
                                      cutlass.select_(wrap, st.phase ^ 1, st.phase))

    def _fragments(self, tiled_mma, sK, sQ, mtid):
        """A consumer thread's wgmma operand fragments, its accumulator, and for each accumulator
        row / column the key row within the tile / the head (shared with the decode kernel)."""
        c = self.cfg
        # the warpgroups of a group split its tiles' rows (a group of one has whole 64-key tiles)
        thr_mma = tiled_mma.get_slice(mtid % (128 * c.mma_wg))
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sK))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sQ))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.bk, c.n)), cutlass.Float32)
        cC_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.bk, c.n))))
        n_rows = cute.size(cC_mn, mode=[0])
        n_cols = cute.size(cC_mn, mode=[1])
        # the SM90 accumulator: a thread's columns are c = v0 + 2 * v2 at n = v0 + 8 * v2 + 2 * (lane % 4),
        # so its columns 16 j .. 16 j + 15 are 16 of token j's 64 heads
        if n_rows != 2 or n_cols != 16 * c.bq:
            raise ValueError(f"unexpected accumulator fragment: {n_rows} rows x {n_cols} columns per thread")
        rows = cute.make_rmem_tensor((n_rows,), cutlass.Int32)  # key row within the tile
        for r in range(n_rows):
            rows[r] = cC_mn[r, 0][0]
        heads = cute.make_rmem_tensor((n_cols,), cutlass.Int32)  # head of each column
        for cc in range(n_cols):
            heads[cc] = cC_mn[0, cc][1] - HEADS * (cc // 16)
        return tCrA, tCrB, acc, rows, heads

    @cute.jit
    def _tile(self, kv_ring, mmas, acc, tCrA, tCrB, q_index, sSc, sc, kst, kt, wreg, plan, q4, cw):
        """Key tile kt in KV stage kst: issue, wait for its wgmmas, finish."""
        self._issue(kv_ring, mmas, acc, tCrA, tCrB, q_index, sSc, sc, kst, plan, cw)
        warpgroup.wait_group(0)
        self._finish(kv_ring, acc, sc, kst, kt, wreg, plan, q4)

    @cute.jit
    def _tiles_overlapped(self, kv_ring, mmas, accs, tCrA, tCrB, q_index, sSc, scs, kst, first, t1, wreg, plan, q4,
                          cw):
        """This group's tiles first, first + G, ... < t1 (G = groups; kst: the stage of tile `first`)
        with two in flight: tile i+1's wgmmas are issued before tile i's epilogue, which then runs
        under them (FA3's intra-warpgroup overlap). The tiles go in chains of P = `overlap` unrolled
        at compile time, each ending in wait_group(0): a wgmma group left in flight across a loop's
        back edge makes ptxas serialise every wgmma (docs/lessons/gemm.md 9). Accumulators and key
        scales alternate between the two register sets of `accs` / `scs`; the tiles left over after
        the whole chains run one at a time."""
        c = self.cfg
        G = c.groups
        P = c.overlap
        n_mine = cutlass.Int32(0)
        if first < t1:
            n_mine = (t1 - first + G - 1) // G
        n_chains = n_mine // P
        for ch in cutlass.range(n_chains, unroll=1):
            base = first + ch * (P * G)
            states = [kst]
            for i in cutlass.range_constexpr(1, P):
                states.append(self._step(states[i - 1], G))
            self._issue(kv_ring, mmas, accs[0], tCrA, tCrB, q_index, sSc, scs[0], states[0], plan, cw)
            for i in cutlass.range_constexpr(1, P + 1):
                if cutlass.const_expr(i < P):
                    self._issue(kv_ring, mmas, accs[i % 2], tCrA, tCrB, q_index, sSc, scs[i % 2], states[i], plan, cw)
                    warpgroup.wait_group(1)
                else:
                    warpgroup.wait_group(0)
                self._finish(kv_ring, accs[(i - 1) % 2], scs[(i - 1) % 2], states[i - 1], base + (i - 1) * G, wreg,
                             plan, q4)
            kst = self._step(states[P - 1], G)
        for kt in cutlass.range(first + n_chains * (P * G), t1, G, unroll=1):
            self._tile(kv_ring, mmas, accs[0], tCrA, tCrB, q_index, sSc, scs[0], kst, kt, wreg, plan, q4, cw)
            kst = self._step(kst, G)

    @cute.jit
    def _issue(self, kv_ring, mmas, acc, tCrA, tCrB, q_index, sSc, sc, kst, plan, cw):
        """KV stage kst: wait for it -> this lane's key scale from shared memory (before the issue)
        -> 4 wgmma into acc, one commit group (in ping-pong inside this warpgroup's turn)."""
        c = self.cfg
        kv_ring.consumer_wait(kst)
        sc[0] = sSc[plan[0], kst.index]
        if cutlass.const_expr(c.pingpong):
            cute.arch.barrier(barrier_id=BAR_TURN0 + cw, number_of_threads=256)
        fence_operand(acc)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mmas[0] if k == 0 else mmas[1], acc, tCrA[(None, None, k, kst.index)],
                      tCrB[(None, None, k, q_index)], acc)
        warpgroup.commit_group()
        if cutlass.const_expr(c.pingpong):
            cute.arch.barrier_arrive(barrier_id=BAR_TURN0 + 1 - cw, number_of_threads=256)

    @cute.jit
    def _finish(self, kv_ring, acc, sc, kst, kt, wreg, plan, q4):
        """After stage kst's wgmmas completed (the caller waited): release the stage, then the
        epilogue of key tile kt."""
        fence_operand(acc)
        kv_ring.consumer_release(kst)
        self._epilogue(acc, wreg, sc[0], kt * self.cfg.bk, plan, q4)
