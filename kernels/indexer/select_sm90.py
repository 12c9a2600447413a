"""The fused decode path, logits -> top-k (spec §6), SM90: each request's top-k over its paged FP8 keys
without writing its [W] row of logits, in the layout of the top-k kernel (kernels/indexer/topk_sm90.py:
int32 [B, min(k, W)], ascending index order, ties to the lower index, -1 past the valid count). The
answer is the unfused pair's (the paged decode kernel, then the top-k kernel) bit for bit: the logits
are the same instructions' and the selection is the top-k kernel's buffered path, whose candidates
come straight from the scoring epilogue instead of from a row in memory.

Five launches, no host sync (kernels/indexer/select_glue.py runs them):
  sample   `SampleSm90`: the decode kernel over 32 whole pages of each request spread evenly over it
           (table column (i * full pages) // 32), into a [B, 2048] sample row; rows of at most CAP
           keys score nothing (they keep every valid key). Scoring the sample is the path's main
           overhead (2048 / n of the keys' bytes), so it is half the top-k kernel's 4096: with
           KK = 1024 of 262,144 keys the buffers then receive ~4,100 +- 18% of their 8,192 slots.
  bound    `BoundSm90`: key_lo of each request, the top-k kernel's `lower_bound` on its sample row
           (the sample's r-th largest, r = `sample_rank(KK, n)`: ~2 KK of n keys at or above it),
           into counts[b, C]; LOWEST_VALID for rows of at most CAP keys.
  collect  `CollectSm90`: the decode kernel with the store replaced: CTA (p, b) appends the (order
           key, index) of each of its keys with key >= key_lo to buffer (b, p), in index order (a warp
           ballot, a warpgroup scan of 4 per-warp counts through shared memory and one named barrier
           a page), and writes its count to counts[b, p] (more than CAP: overflowed, it stops writing).
  repair   `RepairSm90`: where a request's bound failed (the buffers overflowed, or hold fewer than KK
           keys although key_lo is above the lowest valid key: a sample unlike its row), the decode
           kernel writes its logits row; every other request's CTAs exit at once.
  finish   the top-k kernel's split `finish`: concatenate the request's buffers, radix select and
           gather, or (a repaired request) the direct path on its logits row.
Rows of at most CAP keys never fail (every valid key fits and is kept): a W <= CAP launch has no
sample, bound or repair. KK > CAP / 4 cannot take the buffers: the glue runs the unfused pair.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from kernels.indexer.decode_sm90 import PAGE, IndexerDecodeSm90, clamped_len
from kernels.indexer.topk_select import CAP, LOWEST_VALID, THREADS, TopkBlocks, fast_path_possible, order_key
from kernels.indexer.topk_sm90 import TopkSmem, buffer_holds

SELECT_SAMPLE = 2048  # sampled keys a request: half the top-k kernel's SAMPLE (their scoring is the cost)
SAMPLE_PAGES = SELECT_SAMPLE // PAGE  # whole pages a sample row scores
BAR_COLLECT = 1  # named barrier of the consumer warpgroup's per-page scan
WARP_LOW_ROWS = 0x11111111  # ballot bits of the lanes 4i: accumulator rows i (0..7) of the warp's 16
WARP_HIGH_ROWS = 0x44444444  # lanes 4i + 2: rows 8 + i


class SelectStep(IndexerDecodeSm90):
    """The entry the three wgmma steps share (one parameter list, one grid of (n_parts, B) CTAs);
    each step's body is its `_select_cta`.
    Arguments: q, codes, scales, w, lens, table as IndexerDecodeSm90's; mL fp32 [B, X] (sample: the
    sample rows, X = SELECT_SAMPLE; repair: the logits rows, X = W; collect: unused); the buffers gKey, gIdx
    int32 [B, C, CAP] and counts int32 [B, C + 1] (the top-k split form's workspace, C = n_parts);
    width W (the logits row a request would have), kk = min(k, W), part_pages, n_parts."""

    scratch_words = 8  # the collect scan's per-warp counts, two pages' worth

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mCodes: cute.Tensor, mScales: cute.Tensor, mW: cute.Tensor,
                 mLens: cute.Tensor, mTable: cute.Tensor, mL: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor,
                 gCount: cute.Tensor, width: Int32, kk: Int32, part_pages: Int32, n_parts: Int32,
                 stream: cuda.CUstream):
        ops = self._paged_operands(mQ, mCodes, mScales, mW)
        self.kernel(*ops[:8], mLens, mTable, mL, gKey, gIdx, gCount, width, kk, part_pages, *ops[8:]).launch(
            grid=(n_parts, cute.size(mLens, mode=[0]), 1), block=[self.cfg.threads, 1, 1], min_blocks_per_mp=2,
            preferred_smem_carveout=100, stream=stream)

    @cute.kernel
    def kernel(self, tma_k: cute.CopyAtom, gK_t: cute.Tensor, tma_q: cute.CopyAtom, gQ_t: cute.Tensor,
               tma_sc: cute.CopyAtom, gSc_t: cute.Tensor, tma_w: cute.CopyAtom, gW_t: cute.Tensor,
               mLens: cute.Tensor, mTable: cute.Tensor, mL: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor,
               gCount: cute.Tensor, width: Int32, kk: Int32, part_pages: Int32, tiled_mma: cute.TiledMma,
               mma_acc: cute.TiledMma, sK_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
               sSc_layout: cute.Layout, sW_layout: cute.Layout, Storage: cutlass.Constexpr):
        self._select_cta(((tma_k, gK_t), (tma_q, gQ_t), (tma_sc, gSc_t), (tma_w, gW_t)), mLens, mTable, mL, gKey,
                         gIdx, gCount, width, kk, part_pages, (tiled_mma, mma_acc),
                         (sK_layout, sQ_layout, sSc_layout, sW_layout), Storage)


class SampleSm90(SelectStep):
    """Row b of mL [B, SELECT_SAMPLE] <- the logits of SAMPLE_PAGES whole pages of request b spread
    evenly over it (all -inf for a request of at most CAP keys: it needs no bound)."""

    @cute.jit
    def _select_cta(self, tma, mLens, mTable, mL, gKey, gIdx, gCount, width, kk, part_pages, mmas, layouts,
                    Storage):
        _, b, _ = cute.arch.block_idx()
        n = clamped_len(mLens, mTable, b, width)
        n_len = cutlass.select_(n > CAP, Int32(SELECT_SAMPLE), Int32(0))
        self._run_pages(tma, mTable, mL, part_pages, mmas, layouts, Storage, n_len, n // PAGE, mL, SELECT_SAMPLE)

    def _table_col(self, i, fp):
        """Sample page i of a request of fp whole pages (fp > CAP / 64 > SAMPLE_PAGES: distinct pages)."""
        return (i * fp) // SAMPLE_PAGES


class RepairSm90(SelectStep):
    """Row b of mL [B, W] <- request b's logits (the decode kernel's) where its buffers do not hold
    its top-k (`buffer_holds`, the finish's own test); other requests: nothing."""

    @cute.jit
    def _select_cta(self, tma, mLens, mTable, mL, gKey, gIdx, gCount, width, kk, part_pages, mmas, layouts,
                    Storage):
        tidx, _, _ = cute.arch.thread_idx()
        _, b, _ = cute.arch.block_idx()
        # every warp sums the counts itself (a few loads a lane, shuffles): no shared memory or barrier
        chunks = cute.size(gCount, mode=[1]) - 1
        total = Int32(0)
        for c in cutlass.range(tidx % 32, chunks, 32, unroll=4):
            total += cutlass.min(gCount[b, c], Int32(CAP + 1))
        for o in cutlass.range_constexpr(5):
            total += cute.arch.shuffle_sync_bfly(total, offset=1 << o)
        if ~buffer_holds(total, kk, gCount[b, chunks]):  # CTA-uniform; held: exit before any setup
            self._run_pages(tma, mTable, mL, part_pages, mmas, layouts, Storage, clamped_len(mLens, mTable, b, width),
                            None, mL, width)


class CollectSm90(SelectStep):
    """Buffer (b, p) <- the (order key, index) of CTA (p, b)'s keys at or above request b's key_lo
    (counts[b, C], from BoundSm90; LOWEST_VALID for a request of at most CAP keys, which CTA 0 writes
    there), in index order; counts[b, p] <- how many (> CAP: overflowed)."""

    @cute.jit
    def _select_cta(self, tma, mLens, mTable, mL, gKey, gIdx, gCount, width, kk, part_pages, mmas, layouts,
                    Storage):
        tidx, _, _ = cute.arch.thread_idx()
        part, b, _ = cute.arch.block_idx()
        n_len = clamped_len(mLens, mTable, b, width)
        chunks = cute.size(gKey, mode=[1])
        # a short request's word may be unset (no bound ran): read either way, used only past CAP
        key_lo = cutlass.select_(n_len > CAP, gCount[b, chunks], Int32(LOWEST_VALID))
        if tidx == 0:
            if part == 0:
                gCount[b, chunks] = key_lo  # the value the other CTAs read, or the short request's
            if part * part_pages * PAGE >= n_len:
                gCount[b, part] = Int32(0)  # no page: the consumers never run
        dst = (gKey[b, part, None], gIdx[b, part, None], gCount, key_lo)
        self._run_pages(tma, mTable, None, part_pages, mmas, layouts, Storage, n_len, None, dst, 0)

    @cute.jit
    def _page_plan(self, dst, st, b, n_len, rows, q4, tidx):
        """(key row of the lane, whether it takes its pair's sum, the limits, the buffer, the running
        count and page parity, the per-warp count slots, this warp's slot, the lane's lower-lane mask)."""
        dKey, dIdx, gCount, key_lo = dst
        key = cutlass.select_((q4 & 2) != 0, rows[1], rows[0])
        state = cute.make_rmem_tensor((2,), Int32)
        state[0] = Int32(0)
        state[1] = Int32(0)
        slots = st.scratch.get_tensor(cute.make_layout((4, 2)))
        return (key, (q4 & 1) == 0, n_len, key_lo, dKey, dIdx, state, slots, (tidx // 32) % 4,
                Int32(cute.arch.lanemask_lt()), (gCount, b))

    @cute.jit
    def _epilogue(self, acc, wreg, sc, s0, plan, q4):
        """The page's survivors appended in index order. A warp's 16 key rows sit two a quad (rows i
        and i + 8 in lanes 4i and 4i + 2), so a lane's place among its warp's survivors is a popcount
        of the ballot's low-row bits below it (row i) or of all low-row bits and the high-row bits below
        it (row 8 + i); the 4 warps' counts (in key order) meet in shared memory."""
        key_row, takes, n_len, key_lo, dKey, dIdx, state, slots, warp, lt, _ = plan
        s = s0 + key_row
        okey = order_key(self._lane_sums(acc, wreg, q4)[0] * sc)
        live = takes & (s < n_len) & (okey >= key_lo)
        ballot = Int32(cute.arch.vote_ballot_sync(live))
        parity = state[1]
        if cute.arch.lane_idx() == 0:
            slots[warp, parity] = Int32(cute.arch.popc(ballot))
        cute.arch.barrier(barrier_id=BAR_COLLECT, number_of_threads=128)
        before = Int32(0)
        total = Int32(0)
        for w in cutlass.range_constexpr(4):
            n_w = slots[w, parity]
            before += cutlass.select_(warp > w, n_w, Int32(0))
            total += n_w
        low = ballot & Int32(WARP_LOW_ROWS)
        rank = cutlass.select_((q4 & 2) != 0,
                               Int32(cute.arch.popc(low)) + Int32(cute.arch.popc(ballot & lt & Int32(WARP_HIGH_ROWS))),
                               Int32(cute.arch.popc(low & lt)))
        pos = state[0] + before + rank
        if live & (pos < CAP):
            dKey[pos] = okey
            dIdx[pos] = s
        state[0] = state[0] + total
        state[1] = parity ^ 1

    @cute.jit
    def _pages_done(self, plan, tidx):
        """The CTA's count, by its first consumer thread."""
        state = plan[6]
        gCount, b = plan[10]
        part, _, _ = cute.arch.block_idx()
        if tidx == 128:
            gCount[b, part] = state[0]


class BoundSm90(TopkBlocks):
    """Grid (B), THREADS threads: counts[b, C] <- key_lo of request b from its sample row (the top-k
    kernel's `lower_bound` over SELECT_SAMPLE keys: fewer than r valid samples, or a request of at most
    CAP keys or a KK the buffers cannot take: LOWEST_VALID). Arguments: the sample rows fp32
    [B, SELECT_SAMPLE], lens, table, counts int32 [B, C + 1], width W, kk."""

    @cute.jit
    def __call__(self, mSample: cute.Tensor, mLens: cute.Tensor, mTable: cute.Tensor, gCount: cute.Tensor,
                 width: Int32, kk: Int32, stream: cuda.CUstream):
        self.kernel(mSample, mLens, mTable, gCount, width, kk).launch(
            grid=[cute.size(mLens, mode=[0]), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mSample: cute.Tensor, mLens: cute.Tensor, mTable: cute.Tensor, gCount: cute.Tensor,
               width: Int32, kk: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        b, _, _ = cute.arch.block_idx()
        n = clamped_len(mLens, mTable, b, width)
        sm = TopkSmem(SELECT_SAMPLE)
        key_lo = Int32(LOWEST_VALID)
        if (n > CAP) & fast_path_possible(kk):  # CTA-uniform
            key_lo = self.lower_bound(mSample, b, n, kk, sm.key, sm.hist, sm.w, sm.state, tidx, 1, SELECT_SAMPLE)
        if tidx == 0:
            gCount[b, cute.size(gCount, mode=[1]) - 1] = key_lo
