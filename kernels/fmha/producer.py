"""The producer warpgroup: Q once per work item, then the K/V tiles of its key list into the smem
stages, by TMA (block lists: one box per tile) or by a 16-byte cp.async gather (per-token
lists); the key split has a producer per tile of its pair. Knock-out seams (variants.py): the
kv rows' copies, `_copy_kv` (gather), `_copy_half_rows` (key split) and `_tma_load` (boxes)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from kernels.fmha.barriers import NamedBarrier
from kernels.regs import pin


class Producer:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _load_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full):
        """Producer: the item's Q rows into sQ by cp.async, each thread's copies arriving on q_full.
        `io`: a variant's TMA atoms (None here)."""
        self._copy_q(atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx)
        cute.arch.cp_async_mbarrier_arrive_noinc(q_full)

    @cute.jit
    def _copy_q(self, atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx):
        """Producer: the CTA's Q rows, row r = (token tok0 + r // hb, head head0 + r % hb); rows past
        the end (or past the kv group) read row 0 and are never stored."""
        c = self.cfg
        cpr = c.d // 8  # 16-byte chunks per row
        rpp = 128 // cpr  # rows per pass of the 128 producer threads
        chunk = ptid % cpr
        if cutlass.const_expr(c.persistent):
            # a runtime loop: unrolled, the row offsets of every pass are invariants of the persistent
            # item loop, hoisted out of it into the producer's 40 registers (spilled up to 72 B)
            for p in cutlass.range(c.m_cta // rpp, unroll=1):
                self._copy_q_row(atom, mQ, sQ, p * rpp + ptid // cpr, chunk, tok0, head0, kvh, s_q, bidx)
        else:  # one item per CTA: unrolled, all the passes' copies are issued back to back (a
            # runtime loop here cost the key split ~10%: docs/perf/fmha.md, v7 regression)
            for p in cutlass.range_constexpr(c.m_cta // rpp):
                self._copy_q_row(atom, mQ, sQ, p * rpp + ptid // cpr, chunk, tok0, head0, kvh, s_q, bidx)

    @cute.jit
    def _copy_q_row(self, atom, mQ, sQ, r, chunk, tok0, head0, kvh, s_q, bidx):
        """This thread's 16-byte chunk of Q row r of the CTA."""
        c = self.cfg
        tok = tok0 + r // c.hb
        hl = r % c.hb
        ok = (tok < s_q) & (head0 + hl - kvh * c.hpg < c.hpg) & (r < c.hb * c.tq)
        src = mQ[tok if ok else 0, head0 + hl if ok else 0, None, bidx]
        cute.copy(atom, cute.local_tile(src, (8,), (chunk,)), cute.local_tile(sQ[r, None], (8,), (chunk,)))

    @cute.jit
    def _produce_tiles(self, atom, tma, mIdx, mK, mV, sK, sVt, sIdx, sMaskFlag, bars, ptid, blk, n_idx, n_tiles, s_kv,
                       kvh, bidx, tok0, causal_off, window, base):
        """Producer, one smem stage per key tile: the indices (one global load per slot, issued a
        tile ahead) and whether any key of the tile needs the mask for some row of the CTA (one
        flag per producer warp), then the K rows, then the V rows, each with its own full barrier:
        K is freed after the softmax, V after PV. Rows come by TMA (block lists) or by the gather.
        `base` counts the key tiles of the CTA's earlier items (stage and phase continue from it)."""
        c = self.cfg
        n, S = c.n_block, c.stages
        n_slots = cute.size(mIdx, mode=[1])
        k_full, k_empty, v_full, v_empty = bars, bars + S, bars + 2 * S, bars + 3 * S
        v_next = mIdx[blk, cutlass.min(ptid, n_slots - 1), bidx]
        for kt in cutlass.range(n_tiles, unroll=1):
            stage = (base + kt) % S
            phase = (((base + kt) // S) & 1) ^ 1
            j = kt * n + ptid
            v = v_next
            if (j >= n_idx) | (v >= s_kv) | (v < 0):
                v = cutlass.Int32(-1)
            v_next = mIdx[blk, cutlass.min(j + n, n_slots - 1), bidx]
            plain = (ptid >= n) | self._key_ok(v, tok0, tok0 + c.tq - 1, causal_off, window)
            cute.arch.mbarrier_wait(k_empty + stage, phase)
            if ptid < n:
                sIdx[ptid, stage] = v
            warp_plain = cutlass.Int32(cute.arch.vote_all_sync(plain))
            if ptid % 32 == 0:
                sMaskFlag[ptid // 32, stage] = warp_plain
            if cutlass.const_expr(c.tma_kv):
                # warp 0, one box per tile: slot 0 holds the first key (-1: an all-invalid tile)
                first = cute.arch.shuffle_sync(cutlass.max(v, 0), 0)
                tma_k, mK_c, tma_v, mV_c = tma
                if ptid < 32:
                    self._tma_load(tma_k, mK_c[None, None, kvh, bidx], (first, 0), (n, c.d), sK, stage, k_full + stage)
                cute.arch.mbarrier_arrive(k_full + stage)
                if cutlass.const_expr(not c.kv_shared):
                    if ptid < 32:
                        cute.arch.mbarrier_wait(v_empty + stage, phase)
                        self._tma_load(tma_v, mV_c[None, None, kvh, bidx], (0, first), (c.dv, n), sVt, stage,
                                       v_full + stage)
            else:
                cute.arch.barrier(barrier_id=NamedBarrier.PRODUCER, number_of_threads=128)
                self._copy_kv(atom, sIdx, mK, sK[None, None, stage], 0, c.d // 64, ptid, stage, kvh, bidx)
                cute.arch.cp_async_mbarrier_arrive_noinc(k_full + stage)
                cute.arch.mbarrier_arrive(k_full + stage)
                if cutlass.const_expr(not c.kv_shared):
                    sV_rows = cute.make_tensor(sVt.iterator, cute.select(sVt.layout, mode=[1, 0, 2]))
                    cute.arch.mbarrier_wait(v_empty + stage, phase)
                    self._copy_kv(atom, sIdx, mV, sV_rows[None, None, stage], 0, c.dv // 64, ptid, stage, kvh, bidx)
                    cute.arch.cp_async_mbarrier_arrive_noinc(v_full + stage)

    @cute.jit
    def _copy_kv(self, atom, sIdx, mT, dst, seg0: int, n_segs: int, ptid, stage, kvh, bidx):
        """Producer: gather 128-byte segments [seg0, seg0 + n_segs) of the tile's kv rows (keys from
        sIdx[:, stage]) into dst (keys, d). 8 threads copy one segment, so a thread copies its
        segments of rows g, g + 16, ... (g = ptid // 8) and computes each row's address once:
        ~3 instructions per 16-byte cp.async instead of ~23 with one row per copy, which made the
        gather the bound (docs/perf/fmha.md). A runtime row loop: unrolled, the compiler hoists
        every swizzled smem address to the kernel entry and they spill. Invalid slots (-1) read
        row 0: the consumers mask them, so their P is exactly 0."""
        for k in cutlass.range(self.cfg.n_block // 16, unroll=1):
            r = ptid // 8 + 16 * k
            src = mT[cutlass.max(sIdx[r, stage], 0), kvh, None, bidx]
            for sg in cutlass.range_constexpr(n_segs):
                chunk = (seg0 + sg) * 8 + ptid % 8
                cute.copy(atom, cute.local_tile(src, (8,), (chunk,)), cute.local_tile(dst[r, None], (8,), (chunk,)))

    @cute.jit
    def _tma_load(self, atom, coords, offset, tile: tuple, dst, stage, bar):
        """One warp: the box `tile` at `offset` of coords (keys past s_kv arrive as zeros) into
        dst[:, :, stage]; bar expects its bytes. The copy elects its issuing lane itself
        (elect.sync over the full warp): called from one thread, it never returns."""
        g = cute.local_tile(cute.domain_offset(offset, coords), tile, (0, 0))
        t_s, t_g = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(dst, 0, 2),
                                         cute.group_modes(g, 0, 2))
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, cute.size_in_bytes(dst.element_type, cute.make_layout(tile)))
        cute.copy(atom, t_g, t_s[None, stage], tma_bar_ptr=bar)

    @cute.jit
    def _produce_pairs(self, atom, mIdx, mK, sK, sIdx, sMaskFlag, bars, ptid, blk, n_idx, n_tiles, s_kv, kvh, bidx,
                       tok0, causal_off, window):
        """Producer of a key split: each half of the producer warpgroup owns one tile of every pair,
        threads 0-63 tile 2p (warpgroup 0's, stage 0: left then right half of d), threads 64-127
        tile 2p + 1 (warpgroup 1's, stage 1: right then left), so the half of d freed last in one
        tile never holds up the other tile's gather (v9, docs/perf/fmha.md)."""
        args = (atom, mIdx, mK, sK, sIdx, sMaskFlag, bars)
        tail = (blk, n_idx, n_tiles, s_kv, kvh, bidx, tok0, causal_off, window)
        if ptid < self.cfg.n_block:
            self._produce_tile_of_pairs(*args, ptid, *tail, 0)
        else:
            self._produce_tile_of_pairs(*args, ptid - self.cfg.n_block, *tail, 1)

    @cute.jit
    def _produce_tile_of_pairs(self, atom, mIdx, mK, sK, sIdx, sMaskFlag, bars, lt, blk, n_idx, n_tiles, s_kv, kvh,
                               bidx, tok0, causal_off, window, stage: cutlass.Constexpr):
        """Tile 2p + stage of every pair p into `stage`, by 64 threads. Thread lt publishes slot lt's
        index for the mask (and each warp whether all its keys pass it) and copies 16-byte chunk
        lt % 8 of each 128-byte segment of rows lt // 8 + 8 q; the row indices of the next pair are
        loaded into registers while this pair's rows are copied, so no copy waits on shared memory
        or on the other producer threads."""
        c = self.cfg
        n = c.n_block
        n_slots = cute.size(mIdx, mode=[1])
        n_rows = n // 8  # rows of the tile this thread copies
        rows_next = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
        rows_now = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
        for q in cutlass.range_constexpr(n_rows):
            rows_next[q] = mIdx[blk, cutlass.min(stage * n + lt // 8 + 8 * q, n_slots - 1), bidx]
        mine_next = mIdx[blk, cutlass.min(stage * n + lt, n_slots - 1), bidx]
        for pair in cutlass.range((n_tiles + 1) // 2, unroll=1):
            j0 = (2 * pair + stage) * n
            for q in cutlass.range_constexpr(n_rows):
                v = rows_next[q]
                if (j0 + lt // 8 + 8 * q >= n_idx) | (v >= s_kv) | (v < 0):
                    v = self._invalid_row()
                rows_now[q] = v
                rows_next[q] = mIdx[blk, cutlass.min(j0 + 2 * n + lt // 8 + 8 * q, n_slots - 1), bidx]
            mine = mine_next
            if (j0 + lt >= n_idx) | (mine >= s_kv) | (mine < 0):
                mine = cutlass.Int32(-1)
            mine_next = mIdx[blk, cutlass.min(j0 + 2 * n + lt, n_slots - 1), bidx]
            plain = self._key_ok(mine, tok0, tok0 + c.tq - 1, causal_off, window)
            # pinned each pair: the 2 x n_rows x segs swizzled smem addresses derive from it inside
            # the loop instead of being hoisted out of it into the producer's registers
            t = pin(lt)
            phase = (pair & 1) ^ 1
            for k in cutlass.range_constexpr(2):
                h = (stage + k) % 2  # stage 0 reads left first, stage 1 right first
                hb = stage * 2 + h
                # the first wait also covers the indices: the owner's mask read them before it
                # freed the half it multiplies locally (0-left, 1-right)
                self._mbar_wait(bars + 4 + hb, phase)
                if cutlass.const_expr(k == 0):
                    sIdx[lt, stage] = mine
                    warp_plain = cutlass.Int32(cute.arch.vote_all_sync(plain))
                    if lt % 32 == 0:
                        sMaskFlag[lt // 32, stage] = warp_plain
                self._copy_half_rows(atom, mK, sK[None, None, stage], rows_now, t, h, kvh, bidx)
                cute.arch.cp_async_mbarrier_arrive_noinc(bars + hb)
                cute.arch.mbarrier_arrive(bars + hb)

    def _invalid_row(self):
        """The row an invalid slot of the key split's pair copies: row 0 (finite; the mask zeroes its P).
        A variant may return -1 and zero-fill the slot instead (prefill_v11.GatherHint)."""
        return cutlass.Int32(0)

    @cute.jit
    def _copy_half_rows(self, atom, mK, dst, rows, t, h: int, kvh, bidx):
        """Key split: half h of d of kv rows `rows` into rows t // 8 + 8 q of dst (keys, d), as the
        16-byte chunks t % 8 of each 128-byte segment."""
        segs = self.cfg.d // 2 // 64
        for q in cutlass.range_constexpr(cute.size(rows)):
            src = mK[rows[q], kvh, None, bidx]
            for sg in cutlass.range_constexpr(segs):
                chunk = (h * segs + sg) * 8 + t % 8
                cute.copy(atom, cute.local_tile(src, (8,), (chunk,)),
                          cute.local_tile(dst[t // 8 + 8 * q, None], (8,), (chunk,)))
