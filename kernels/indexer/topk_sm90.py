"""Indexer top-k in CuTeDSL (spec §6): for each row of fp32 scores [T, S] (the logits kernel's output,
-inf where a key is masked), the indices of the KK = min(k, S) largest valid entries, int32 [T, KK],
-1 in the slots past the row's valid count.

Semantics: those of oracles/indexer.py `indexer_topk` as a set — exact ties go to the lower index, so
the selected set equals the oracle's (stable descending sort) exactly, not just up to ties; -inf is
never selected. Order within a row: ascending entry index (not by score), then the -1 slots.
-0.0 and +0.0 are equal (one key). NaN: a +NaN ranks above +inf (as torch.sort's descending order puts
NaN first); a -NaN (sign bit set) ranks below -inf and is never selected (unlike the oracle, which
ranks every NaN first; the logits kernel produces none).

Every comparison is on an order key (kernels/indexer/topk_select.py: a signed int32 with the order of
the float, -0.0 == +0.0); valid means key > key(-inf).

Direct (rows of at most CAP entries; `IndexerTopkSm90(buffered=False)`), one CTA a row:
  radix select  3 passes over the row (digits of 11, 11 and 10 bits, high first): each builds the
           histogram of the digit among the valid entries whose higher digits equal the prefix found so
           far (shared-memory atomics), then a block suffix-scan finds
           the bucket holding the `remaining`-th largest; after the 3 passes the prefix is the KK-th
           largest key (the threshold) and `remaining` how many entries equal to it are taken. If pass 1
           finds at most KK valid entries, every valid entry is taken (threshold -inf, no ties).
  gather   in index order, THREADS entries per step: ballots of "above the threshold" and "equal to
           it", a block scan of the two counts, and each selected entry's slot = (above before it) +
           min(equal before it, remaining) — so the ties taken are the first `remaining` in index
           order and the output is in ascending index order.
  fill     slots [selected, KK) get -1.
The row is read 4 times; a short row stays in L1/L2.

Buffered (longer rows), one read of the row:
  bound    a strided sample of SAMPLE entries gives a lower bound key_lo, the sample's r-th largest with
           r chosen so that about 2 KK entries of the row are at least key_lo (`sample_rank`).
  collect  the entries >= key_lo go to a buffer of (key, index) pairs in index order (PER_THREAD
           consecutive entries a thread, 16-byte loads, a block scan places them).
  select   the radix select and the gather above, on the buffer.
The buffered path holds when the buffer took every entry >= key_lo (at most CAP) and at least KK of
them, so the KK-th largest of the row is among them; otherwise (rows built against the sample, long
runs of one value) the row takes the direct path's 4 reads. Two forms:
  `IndexerTopkSm90()`      one CTA a row, the buffer in shared memory (many rows: the grid fills the
                           chip);
  `IndexerTopkSplitSm90()` C CTAs a row (few long rows: one SM streams only ~20 GB/s): `partial`,
                           grid (T, C), each CTA bounds (the same sample, so the same key_lo) and
                           collects one chunk into its own global buffer; `finish`, grid (T), sums the
                           chunks' counts, concatenates the buffers in chunk order (still index order)
                           into shared memory and selects — or falls back on the row.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import memory
from cutlass import Int32

from kernels.indexer.topk_select import (
    BINS,
    CAP,
    CHUNK_BITS,
    LOWEST_VALID,
    MAX_CHUNKS,
    PER_THREAD,
    SAMPLE,
    THREADS,
    WARPS,
    TopkBlocks,
    fast_path_possible,
)


class TopkSmem:
    """The shared memory of a top-k CTA: the histogram, the scan and state words, and `buffer` (key,
    index) pairs (none for the direct path)."""

    def __init__(self, buffer: int, offsets: int = 0):
        smem = memory.SmemAllocator()
        self.hist = smem.allocate_tensor(Int32, cute.make_layout((BINS,)), byte_alignment=16)
        self.w = smem.allocate_tensor(Int32, cute.make_layout((WARPS,)), byte_alignment=16)
        self.state = smem.allocate_tensor(Int32, cute.make_layout((2,)), byte_alignment=8)
        self.key = self.idx = None
        if buffer:
            self.key = smem.allocate_tensor(Int32, cute.make_layout((buffer,)), byte_alignment=16)
            self.idx = smem.allocate_tensor(Int32, cute.make_layout((buffer,)), byte_alignment=16)
        self.off = None
        if offsets:
            self.off = smem.allocate_tensor(Int32, cute.make_layout((offsets,)), byte_alignment=16)


class TopkFinish(TopkBlocks):
    """What every form's kernels share: where the CTA stands, and the end (select and gather on the
    buffer or, when `fast` is 0, on the row; then the -1 fill)."""

    @cute.jit
    def _cta(self):
        """(this thread, the CTA's row, its chunk): the grid is (rows, chunks), one chunk (0) without a
        split. The sizes are read by each kernel where it needs them: reading the row length early in
        `finish` (where only its fallback uses it) changes its code."""
        tidx, _, _ = cute.arch.thread_idx()
        row, chunk, _ = cute.arch.block_idx()
        return tidx, row, chunk

    @cute.jit
    def finish_row(self, mX, mOut, row, fast, count, sm: TopkSmem, tidx):
        n = mX.shape[1]
        kk = mOut.shape[1]
        n_sel = Int32(0)
        if cutlass.const_expr(sm.key is not None):
            if fast != 0:
                thr, need, n_sel = self.radix_select(mX, row, sm.key, count, kk, False, sm.hist, sm.w, sm.state, tidx)
                self.gather(mX, row, sm.key, sm.idx, count, thr, need, n_sel, False, mOut, sm.w, tidx)
        if fast == 0:
            thr, need, n_sel = self.radix_select(mX, row, None, n, kk, True, sm.hist, sm.w, sm.state, tidx)
            self.gather(mX, row, None, None, n, thr, need, n_sel, True, mOut, sm.w, tidx)
        for j in cutlass.range(n_sel + tidx, kk, THREADS):
            mOut[row, j] = Int32(-1)


def buffer_holds(count, kk, key_lo):
    """The buffered path's condition: no overflow, and KK entries at least key_lo (or every valid one)."""
    return (count <= CAP) & ((count >= kk) | (key_lo == Int32(LOWEST_VALID)))


class IndexerTopkSm90(TopkFinish):
    """One CTA a row. Runtime: rows T, row length S (any row stride), KK = the output's width (min(k, S),
    host-chosen). Arguments: scores [T, S] fp32 (unit column stride), out [T, KK] int32 (unit column
    stride). The compile's assumed alignment of the scores decides the collect pass's load width.
    `buffered=False`: the direct path alone (8 KB of shared memory instead of 72 KB: 4 CTAs an SM)."""

    def __init__(self, buffered: bool = True, per_thread: int = PER_THREAD):
        super().__init__(per_thread)
        self.buffered = buffered

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, stream):
        self.kernel(mX, mOut).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor):
        tidx, row, _ = self._cta()
        n = mX.shape[1]
        kk = mOut.shape[1]
        sm = TopkSmem(CAP if self.buffered else 0)
        fast = Int32(0)
        count = Int32(0)
        if cutlass.const_expr(self.buffered):
            if fast_path_possible(kk):
                key_lo = Int32(LOWEST_VALID)
                if n > CAP:
                    key_lo = self.lower_bound(mX, row, n, kk, sm.key, sm.hist, sm.w, sm.state, tidx, n // SAMPLE)
                count = self.collect(mX, row, 0, n, key_lo, sm.key, sm.idx, sm.w, tidx)
                if buffer_holds(count, kk, key_lo):
                    fast = Int32(1)
        self.finish_row(mX, mOut, row, fast, count, sm, tidx)


def chunk_length(n, chunks, step):
    """Entries a chunk of an n-entry row covers: whole collect steps (so chunks start 16-byte aligned)."""
    return (n + chunks * step - 1) // (chunks * step) * step


class IndexerTopkSplitSm90(TopkFinish):
    """C CTAs a row. Arguments: scores [T, S] fp32, out [T, KK] int32 (as IndexerTopkSm90), and the
    workspace: keys and indices int32 [T, C, CAP] (each chunk's buffer), counts int32 [T, C + 1] (each
    chunk's count, then the row's key_lo); nothing in it needs to be initialised."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor,
                 gCount: cute.Tensor, stream):
        self.partial(mX, mOut, gKey, gIdx, gCount).launch(
            grid=[mX.shape[0], gKey.shape[1], 1], block=[THREADS, 1, 1], stream=stream)
        self.finish(mX, mOut, gKey, gIdx, gCount).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def partial(self, mX: cute.Tensor, mOut: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor, gCount: cute.Tensor):
        tidx, row, chunk = self._cta()
        n = mX.shape[1]
        kk = mOut.shape[1]
        chunks = gKey.shape[1]
        sm = TopkSmem(SAMPLE)
        count = Int32(CAP + 1)  # "overflowed": the row falls back
        key_lo = Int32(LOWEST_VALID)
        if fast_path_possible(kk):
            if n > CAP:
                key_lo = self.lower_bound(mX, row, n, kk, sm.key, sm.hist, sm.w, sm.state, tidx, n // SAMPLE)
            length = chunk_length(n, chunks, self.step)
            start = chunk * length
            count = self.collect(mX, row, start, cutlass.min(start + length, n), key_lo,
                                 gKey[row, chunk, None], gIdx[row, chunk, None], sm.w, tidx)
        if tidx == 0:
            gCount[row, chunk] = count
            if chunk == 0:
                gCount[row, chunks] = key_lo

    @cute.kernel
    def finish(self, mX: cute.Tensor, mOut: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor, gCount: cute.Tensor):
        """Grid (T): the chunks' buffers concatenated in chunk order into shared memory, all at once:
        a block scan of the counts gives each chunk's offset, and each candidate finds its chunk by
        binary search over them (no serial pass over the chunks: the fused decode path has up to
        MAX_CHUNKS of them a row). Then the select, or the fallback on the row."""
        tidx, row, _ = self._cta()
        kk = mOut.shape[1]
        chunks = gKey.shape[1]
        sm = TopkSmem(CAP, MAX_CHUNKS)
        sKey, sIdx, sOff = sm.key, sm.idx, sm.off
        total = Int32(0)
        for base in cutlass.range(0, chunks, THREADS, unroll=1):  # CTA-uniform
            c = base + tidx
            cnt = Int32(0)
            if c < chunks:
                cnt = cutlass.min(gCount[row, c], Int32(CAP + 1))  # no int32 overflow over many chunks
            before, step_total = self.block_scan(cnt, sm.w, tidx)
            if c < chunks:
                sOff[c] = total + before
            total += step_total
        fast = Int32(0)
        if buffer_holds(total, kk, gCount[row, chunks]):
            fast = Int32(1)
            # unrolled and branch-free, so a thread's searches and loads overlap (serial ones made the
            # finish 2x slower over 512 chunks)
            for pos in cutlass.range(tidx, total, THREADS, unroll=4):
                lo = Int32(0)  # the last chunk starting at or before pos (empty chunks start where the next does)
                hi = chunks  # sOff[lo] <= pos < sOff[hi] (sOff[chunks] = total); once hi = lo + 1, mid = lo
                for _ in cutlass.range_constexpr(CHUNK_BITS):
                    mid = (lo + hi) // 2
                    up = sOff[mid] <= pos
                    lo = cutlass.select_(up, mid, lo)
                    hi = cutlass.select_(up, hi, mid)
                sKey[pos] = gKey[row, lo, pos - sOff[lo]]
                sIdx[pos] = gIdx[row, lo, pos - sOff[lo]]
            cute.arch.barrier()
        self.finish_row(mX, mOut, row, fast, total, sm, tidx)


class IndexerTopkFinishSm90(IndexerTopkSplitSm90):
    """The split form's `finish` alone, over buffers another kernel filled (the fused decode path,
    kernels/indexer/select_sm90.py). Arguments as IndexerTopkSplitSm90's; at most MAX_CHUNKS chunks."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, gKey: cute.Tensor, gIdx: cute.Tensor,
                 gCount: cute.Tensor, stream):
        self.finish(mX, mOut, gKey, gIdx, gCount).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)
