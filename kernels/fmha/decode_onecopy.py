"""A one-copy producer for the fused FP8 decode (issue #25, candidate `cutedsl:fused-pk-onecopy`): the stage
(which 64 threads) and the half of d (left: code segments 0-3; right: 4-6 + the RoPE) are run-time values,
so the SASS holds one copy of the row loads, the conversion and the stores instead of four (one per stage
and half: decode_prefetch.py's trace-time `stage` and `h`).

Why (lesson 43): the producer alone takes the whole kernel's time at h_q 64, and doubling its conversion
code (the peeled first batch, 224 -> 448 HMUL2) made it 35% slower there: its instruction footprint, on
the SM beside two consumer warpgroups, looks like a bound. Costs: a half's fourth segment is converted and
then replaced by the RoPE chunk in the right half (a select a word), a uniform branch picks the fourth
load, and the halves run as a run-time loop of two (the slot validity published in the first).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_fused import ROWS_PER_BATCH, e4m3x2_to_bf16x2
from kernels.fmha.decode_prefetch import PACK_BITS


class OneCopyProducer:
    """Mixin of a fused decode form (before it in the bases): the producer with run-time stage and half."""

    @cute.jit
    def _produce(self, caches, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles):
        n = self.cfg.n_block
        stage = cute.arch.make_warp_uniform(ptid // n)
        lt = ptid - stage * n
        rows = sRows[None, None, stage]
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        self._copy_slot(caches, rows[None, 0], bidx, base + stage * n + lt, lt)
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j0 = base + (2 * pair + stage) * n
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._copy_slot(caches, rows[None, 1 - buf], bidx, j0 + 2 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            t = lt
            mine = self._valid_token(caches, bidx, j0 + t, rows[t, buf])
            k0p = self._k0_padded(caches[3])
            if pair == 0:
                self._prefetch_row(caches, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            bs = cute.size(cache[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            packed = (blk_m << PACK_BITS) | (mm - blk_m * bs)
            rows[t, buf] = cutlass.select_(mine >= 0, packed, Int32(-1))
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            for k in cutlass.range(2, unroll=1):
                h = (stage + k) % 2  # stage 0 fills left first, stage 1 right first (the order they are freed)
                hb = stage * 2 + h
                self._half_rt(cache, sK[None, None, stage], rows[None, buf], sIdx, sMaskFlag, mine, t, h, k,
                              bars + hb, bars + 4 + hb, (pair & 1) ^ 1, stage)
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)
                j1 = j0 + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + t, rows[t, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)

    @cute.jit
    def _half_rt(self, cache, dst, rows, sIdx, sMaskFlag, mine, t, h, k, full, empty, phase, stage):
        cute.arch.mbarrier_wait(empty, phase)
        if k == 0:  # the tile's slot validity, with its first half
            sIdx[t, stage] = mine
            warp_plain = Int32(cute.arch.vote_all_sync(mine >= 0))
            if t % 32 == 0:
                sMaskFlag[t // 32, stage] = warp_plain
        first, count = self._batch_range(self.cfg.n_block // 8 // ROWS_PER_BATCH)
        for b in cutlass.range(first, first + count, unroll=1):
            regs = self._regs_rt()
            self._load_batch_rt(cache, rows, t, b, h, *regs)
            for i in cutlass.range_constexpr(ROWS_PER_BATCH):
                self._store_row_rt(dst, *regs, i, t // 8 + 8 * (b * ROWS_PER_BATCH + i), h, t % 8, full)
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        self._arrive_full(full, t)

    @staticmethod
    def _regs_rt():
        """A batch's registers: segments 0-2 (8 codes each), the half's scale bytes, `ext` (16 bytes a row:
        segment 3's 8 codes in the left half, the RoPE chunk in the right: one set of registers for
        both), the tokens."""
        br = ROWS_PER_BATCH
        return (cute.make_rmem_tensor((8, 3, br), cutlass.Float8E4M3FN), cute.make_rmem_tensor((4, br), cutlass.Uint8),
                cute.make_rmem_tensor((8, br), BFloat16), cute.make_rmem_tensor((br,), Int32))

    @cute.jit
    def _load_batch_rt(self, cache, rows, t, b, h, raw, scl, ext, vs):
        codes, rope, sc = cache
        c8 = t % 8
        for i in cutlass.range_constexpr(ROWS_PER_BATCH):
            e = rows[t // 8 + 8 * (b * ROWS_PER_BATCH + i)]
            ee = cutlass.max(e, 0)
            blk, tok = ee >> PACK_BITS, ee & ((1 << PACK_BITS) - 1)
            vs[i] = e
            src = codes[blk, tok, None]
            for sg in cutlass.range_constexpr(3):
                cute.autovec_copy(cute.local_tile(src, (8,), ((h * 4 + sg) * 8 + c8,)), raw[None, sg, i])
            # the fourth 16 bytes of registers: segment 3's 8 codes (left) or the RoPE chunk (right), by two
            # unconditional 8-byte loads from selected addresses (loads under a branch into one register
            # array sent it to local memory)
            rope_at = cute.local_tile(rope[blk, tok, None], (8,), (c8,)).iterator.toint()
            lo = cutlass.select_(h == 0, cute.local_tile(src, (8,), (3 * 8 + c8,)).iterator.toint(), rope_at)
            e8 = cute.recast_tensor(ext[None, i], cutlass.Float8E4M3FN)  # (16,)
            for part, addr in ((0, lo), (1, rope_at + 8)):
                g = cute.make_tensor(cute.make_ptr(cutlass.Float8E4M3FN, addr, cute.AddressSpace.gmem, assumed_align=8),
                                     cute.make_layout((8,)))
                cute.autovec_copy(g, cute.local_tile(e8, (8,), (part,)))
            cute.autovec_copy(cute.local_tile(sc[blk, tok, None], (4,), (h,)), scl[None, i])

    @cute.jit
    def _store_row_rt(self, dst, raw, scl, ext, vs, i: cutlass.Constexpr, r, h, c8, full):
        """decode_fused._store_row with h at run time: every segment converted, the fourth replaced by the
        row's RoPE chunk in the right half; zeros for a slot not read."""
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        words = cute.recast_tensor(raw, Int32)  # (2, 3, br)
        extw = cute.recast_tensor(ext, Int32)  # (4, br): segment 3's codes in words 0-1, or the RoPE
        ok = vs[i] >= 0
        for sg in cutlass.range_constexpr(4):
            vals = cute.make_rmem_tensor((8,), BFloat16)
            out = cute.recast_tensor(vals, Int32)
            e = Int32(scl[sg, i])
            half = (e + 120) << 7  # bf16 bits of 2^(e - 7)
            scale2 = half | (half << 16)
            for wd in cutlass.range_constexpr(2):
                w = cutlass.select_(ok, words[wd, sg, i] if sg < 3 else extw[wd, i], Int32(0))
                out[2 * wd] = e4m3x2_to_bf16x2(w, 0x9180, scale2)
                out[2 * wd + 1] = e4m3x2_to_bf16x2(w, 0xB3A2, scale2)
            if cutlass.const_expr(sg == 3):
                for q in cutlass.range_constexpr(4):
                    out[q] = cutlass.select_(h == 1, cutlass.select_(ok, extw[q, i], Int32(0)), out[q])
            chunk = (h * 4 + sg) * 8 + c8
            cute.copy(st_atom, vals, cute.local_tile(dst[r, None], (8,), (chunk,)))
            self._store_peer(vals, dst, r, chunk, full)
