"""The FP8 decode's producer with its raw rows staged in shared memory (issue #25, candidate v9): the
whole producer warpgroup fills one K unit at a time while the next unit's raw bytes are in flight by
`cp.async`, so a unit's row loads are off its critical path.

Why (v8, docs/perf/fmha.md): each half-unit waited one L2 round trip after its half was freed (28-37% of
the producer's body, ncu), and holding a second batch of rows in registers needs registers the
consumers hold (88 / 2 x 208). Shared memory has 15 KB free: one unit of 32 rows x 320 bytes (a row's
codes of one half of d, or the right half's three code segments + its RoPE) and their scale words.

A unit is (stage s, half h, row block rb): rows [32 rb, 32 rb + 32) of the tile in stage s, half h of
d. Paired (h_q 128) a CTA converts its own 32 rows (rb = its rank), four units a pair; alone (h_q 64)
both row blocks, eight. Units go in the order the consumers free their halves (0L, 1R, 0R, 1L), each:

    wait for this thread's cp.async; barrier      the unit's rows and scales are in the staging buffer
    read thread's 2 rows x 4 chunks into registers
    barrier                                        the buffer is free
    cp.async of the next unit's rows               (at a pair's last unit: pack the next pair's slots first)
    wait for the half to be freed, convert, store (and st.async into the peer), arrive on its full barrier

Thread roles: as a slot owner thread p (stage p // 64, slot p % 64) copies, validates, packs and
publishes its slot as v8 does (decode_prefetch.py), the next pair's tokens and L2 prefetches a pair
ahead; as a copier it takes row p // 4 of the unit, 16-byte chunks p % 4 + 4 m; as a converter rows
p // 8 + 16 q (q < 2), 16-byte chunk p % 8 of each 64-value segment (their swizzle is that of v8's rows).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_pair import FusedQTma
from kernels.fmha.decode_prefetch import PACK_BITS, ROW_BYTES, SEG_BYTES
from kernels.fmha.decode_ptx import cp_async_4, cp_async_16, ld_b32, ld_b64, ld_shared_b32, ld_shared_b64

STAGE_ROWS = 32  # rows a unit
STAGE_ROW_BYTES = 320  # a staged row: the right half's 192 code bytes + 128 RoPE bytes (the left's 256 fit);
#                        5 x 64 bytes, so the converters' four rows of a warp read two wavefronts
STAGE_SCALES = STAGE_ROWS * STAGE_ROW_BYTES  # the units' scale words after the rows


class FusedStaged(FusedQTma):
    """The default FP8 decode (decode_pair.FusedQTma) with the staged producer (module docstring)."""

    staging_words = (STAGE_SCALES + 4 * STAGE_ROWS) // 4

    def _units(self) -> int:
        return 4 if self._paired() else 8

    def _full_count(self) -> int:
        """Every producer thread arrives once a unit: 128 a half paired, 256 (two row blocks) alone."""
        return 128 * (self._units() // 4)

    @cute.jit
    def _unit(self, i):
        """(stage, half, row block) of the pair's unit i: halves in the order they are freed, 0L 1R 0R 1L."""
        u = i
        rb = Int32(0)
        if cutlass.const_expr(self._paired()):
            rb = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        else:
            u = i >> 1
            rb = i & 1
        return u & 1, ((u >> 1) ^ u) & 1, rb

    @cute.jit
    def _produce(self, caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles, staging):
        n = self.cfg.n_block
        n_units = self._units()
        own = cute.arch.make_warp_uniform(ptid // n)  # the stage of this thread's slot
        lt = ptid - own * n
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        lens = (caches[3][bidx], caches[7][bidx])  # loaded once (v8)
        k0p = self._k0_padded(caches[2])
        stg = staging.toint()
        bar = NamedBarrier.ROWS0

        self._copy_slot(caches, sRows[None, 0, own], bidx, base + own * n + lt, lt)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
        self._copy_slot(caches, sRows[None, 1, own], bidx, base + (2 + own) * n + lt, lt)
        mine = self._pack_slot(caches, lens, sRows, base + own * n + lt, lt, 0, own, k0p)
        self._prefetch_row(caches, all_lines, base + own * n >= k0p, mine)
        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
        self._stage_unit(caches, sRows, stg, ptid, base, k0p, 0, Int32(0))
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            for i in cutlass.range(n_units, unroll=1):
                cute.arch.cp_async_wait_group(0)  # this thread's copies: the unit's rows, the next tokens
                cute.arch.barrier(barrier_id=bar, number_of_threads=128)
                if i == 0:
                    if pair + 1 < n_pairs:  # the next pair's rows into L2, a pair ahead (v8's rule)
                        j1 = base + (2 * pair + 2 + own) * n
                        nxt = self._valid_token(caches, lens, j1 + lt, sRows[lt, 1 - buf, own])
                        self._prefetch_row(caches, all_lines, j1 >= k0p, nxt)
                s, h, rb = self._unit(i)
                words, scl, oks = self._read_unit(sRows, stg, ptid, buf, s, h, rb)
                cute.arch.barrier(barrier_id=bar, number_of_threads=128)  # every read of the buffer is done
                if i == n_units - 1:
                    if pair + 1 < n_pairs:
                        j1 = base + (2 * pair + 2 + own) * n + lt
                        mine = self._pack_slot(caches, lens, sRows, j1, lt, 1 - buf, own, k0p)
                        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
                        self._stage_unit(caches, sRows, stg, ptid, base, k0p, pair + 1, Int32(0))
                        cute.arch.cp_async_commit_group()
                        self._copy_slot(caches, sRows[None, buf, own], bidx, j1 + 2 * n, lt)
                        cute.arch.cp_async_commit_group()
                else:
                    self._stage_unit(caches, sRows, stg, ptid, base, k0p, pair, i + 1)
                    cute.arch.cp_async_commit_group()
                self._convert_unit(sK, sIdx, sMaskFlag, bars, words, scl, oks, mine, ptid, lt, own, pair, i)

    @cute.jit
    def _pack_slot(self, caches, lens, sRows, j, lt, buf, own, k0p):
        """Slot j's token (raw in sRows[lt, buf, own]) validated and packed in place as `block << 10 | token`
        or -1 (v8's packed slots); returns the token or -1, which the owner publishes for the mask."""
        mine = self._valid_token(caches, lens, j, sRows[lt, buf, own])
        bs = cute.size(self._select_cache(caches, j - lt >= k0p)[0], mode=[1])
        mm = cutlass.max(mine, 0)
        blk_m = mm // bs
        sRows[lt, buf, own] = cutlass.select_(mine >= 0, (blk_m << PACK_BITS) | (mm - blk_m * bs), Int32(-1))
        return mine

    @cute.jit
    def _stage_unit(self, caches, sRows, stg, ptid, base, k0p, pair, i):
        """cp.async of unit i of `pair`: thread p copies 16-byte chunks p % 4 + 4 m of the half's bytes of row
        p // 4 (16 chunks left, 20 right) and, one thread a row, the half's 4 scale bytes. A slot not read
        copies its cache's token 0 (its conversion zeroes it)."""
        n = self.cfg.n_block
        s, h, rb = self._unit(i)
        codes, sc = self._select_cache(caches, base + (2 * pair + s) * n >= k0p)
        r = ptid // 4
        e = sRows[STAGE_ROWS * rb + r, pair & 1, s]
        if e >= 0:  # a slot not read copies nothing: its conversion zeroes whatever the buffer holds (lesson 46)
            blk = Uint64(Uint32(e >> PACK_BITS)) * Uint64(Uint32(codes.layout.stride[0]))
            tok = Uint32(e & ((1 << PACK_BITS) - 1))
            src = Int64(blk + Uint64(tok * ROW_BYTES)) + codes.iterator.toint() + Int64(h * 256 + (ptid % 4) * 16)
            dst = stg + r * STAGE_ROW_BYTES + (ptid % 4) * 16
            for m in cutlass.range_constexpr(5):
                if cutlass.const_expr(m < 4):
                    cp_async_16(dst + m * 64, src + m * 64)
                elif h == 1:
                    cp_async_16(dst + m * 64, src + m * 64)
            if ptid % 4 == 0:
                cp_async_4(stg + STAGE_SCALES + r * 4,
                           Int64(blk + Uint64(tok * 8)) + sc.iterator.toint() + Int64(h * 4))

    @cute.jit
    def _read_unit(self, sRows, stg, ptid, buf, s, h, rb):
        """The converter's two staged rows (p // 8 + 16 q): segments 0-2's 8 code bytes of chunk p % 8, the fourth
        chunk's 16 bytes (segment 3's codes and 8 unused bytes, or the RoPE chunk), the scale word, validity."""
        c8 = ptid % 8
        row = stg + (ptid // 8) * STAGE_ROW_BYTES
        ext = row + 192 + cutlass.select_(h == 0, c8 * 8, c8 * 16)
        words = cute.make_rmem_tensor((10, 2), Int32)
        scl = cute.make_rmem_tensor((2,), Int32)
        oks = cute.make_rmem_tensor((2,), cutlass.Boolean)
        for q in cutlass.range_constexpr(2):
            at = q * 16 * STAGE_ROW_BYTES
            for w0, addr, imm in ((0, row + c8 * 8, 0), (2, row + c8 * 8, 64), (4, row + c8 * 8, 128), (6, ext, 0),
                                  (8, ext, 8)):
                v = ld_shared_b64(addr, imm + at)
                words[w0, q], words[w0 + 1, q] = Int32(v), Int32(v >> 32)
            scl[q] = ld_shared_b32(stg + STAGE_SCALES + (ptid // 8) * 4, q * 64)
            oks[q] = sRows[STAGE_ROWS * rb + ptid // 8 + 16 * q, buf, s] >= 0
        return words, scl, oks

    @cute.jit
    def _convert_unit(self, sK, sIdx, sMaskFlag, bars, words, scl, oks, mine, ptid, lt, own, pair, i):
        """Wait for the unit's half to be freed (with a stage's first unit of the pair its slot owners publish
        the slots), convert the two rows into the swizzled K tile here and in the peer, arrive on the half's
        full barrier."""
        s, h, rb = self._unit(i)
        full, empty = bars + 2 * s + h, bars + 4 + 2 * s + h
        cute.arch.mbarrier_wait(empty, (pair & 1) ^ 1)
        first = s
        if cutlass.const_expr(not self._paired()):
            first = 2 * s
        if (i == first) & (own == s):
            self._publish(sIdx, sMaskFlag, mine, lt, s)
        r0, c8 = ptid // 8, ptid % 8
        dst = sK[None, None, s].iterator.toint()
        local = dst + h * (4 * SEG_BYTES) + (STAGE_ROWS * rb + r0) * 128 + ((c8 ^ (r0 % 8)) << 4)
        peer, peer_bar = self._peer_addresses(local, full)
        for q in cutlass.range_constexpr(2):
            self._store_row(words, scl[q], oks[q], q, h, local, peer, peer_bar, 16 * 128)
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        self._arrive_full(full, ptid)


class FusedTwoPath(FusedStaged):
    """Candidate v9b: at h_q 128 (paired) the staged producer with a second path in flight: units 0 and 2 of a
    pair come through the staging buffer (cp.async), units 1 and 3 straight into a second register set
    (`ld.global`), each issued a unit or two ahead, so two units (20 KB) are in flight while one converts,
    not one (lesson 46: the bytes in flight bound the fill). Alone (h_q 64) v8's producer."""

    def _full_count(self) -> int:
        return 128 if self._paired() else 64

    @cute.jit
    def _produce(self, caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles, staging):
        if cutlass.const_expr(not self._paired()):
            FusedQTma._produce(self, caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx,
                               n_tiles, staging)
        else:
            self._produce_two_paths(caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx,
                                    n_tiles, staging)

    @cute.jit
    def _produce_two_paths(self, caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx,
                           n_tiles, staging):
        n = self.cfg.n_block
        own = cute.arch.make_warp_uniform(ptid // n)
        lt = ptid - own * n
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        lens = (caches[3][bidx], caches[7][bidx])
        k0p = self._k0_padded(caches[2])
        stg = staging.toint()
        bar = NamedBarrier.ROWS0

        self._copy_slot(caches, sRows[None, 0, own], bidx, base + own * n + lt, lt)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
        self._copy_slot(caches, sRows[None, 1, own], bidx, base + (2 + own) * n + lt, lt)
        mine = self._pack_slot(caches, lens, sRows, base + own * n + lt, lt, 0, own, k0p)
        self._prefetch_row(caches, all_lines, base + own * n >= k0p, mine)
        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
        self._stage_unit(caches, sRows, stg, ptid, base, k0p, 0, Int32(0))
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            regs_b = self._load_unit(caches, sRows, ptid, base, k0p, pair, Int32(1))
            # unit 0: from the staging buffer; unit 2 goes into it
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=bar, number_of_threads=128)
            if pair + 1 < n_pairs:  # the next pair's rows into L2, a pair ahead (v8's rule)
                j1 = base + (2 * pair + 2 + own) * n
                nxt = self._valid_token(caches, lens, j1 + lt, sRows[lt, 1 - buf, own])
                self._prefetch_row(caches, all_lines, j1 >= k0p, nxt)
            s0, h0, rb = self._unit(Int32(0))
            regs_a = self._read_unit(sRows, stg, ptid, buf, s0, h0, rb)
            cute.arch.barrier(barrier_id=bar, number_of_threads=128)
            self._stage_unit(caches, sRows, stg, ptid, base, k0p, pair, Int32(2))
            cute.arch.cp_async_commit_group()
            self._convert_unit(sK, sIdx, sMaskFlag, bars, *regs_a, mine, ptid, lt, own, pair, Int32(0))
            # unit 1: the registers loaded at the pair's start; unit 3's loads go out first
            regs_a = self._load_unit(caches, sRows, ptid, base, k0p, pair, Int32(3))
            self._convert_unit(sK, sIdx, sMaskFlag, bars, *regs_b, mine, ptid, lt, own, pair, Int32(1))
            # unit 2: from the staging buffer; the next pair's unit 0 goes into it
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=bar, number_of_threads=128)
            s2, h2, rb2 = self._unit(Int32(2))
            regs_b = self._read_unit(sRows, stg, ptid, buf, s2, h2, rb2)
            cute.arch.barrier(barrier_id=bar, number_of_threads=128)
            if pair + 1 < n_pairs:
                j1 = base + (2 * pair + 2 + own) * n + lt
                mine = self._pack_slot(caches, lens, sRows, j1, lt, 1 - buf, own, k0p)
                cute.arch.barrier(barrier_id=bar, number_of_threads=128)
                self._stage_unit(caches, sRows, stg, ptid, base, k0p, pair + 1, Int32(0))
                cute.arch.cp_async_commit_group()
                self._copy_slot(caches, sRows[None, buf, own], bidx, j1 + 2 * n, lt)
                cute.arch.cp_async_commit_group()
            self._convert_unit(sK, sIdx, sMaskFlag, bars, *regs_b, mine, ptid, lt, own, pair, Int32(2))
            # unit 3: the registers loaded during unit 1
            self._convert_unit(sK, sIdx, sMaskFlag, bars, *regs_a, mine, ptid, lt, own, pair, Int32(3))

    @cute.jit
    def _load_unit(self, caches, sRows, ptid, base, k0p, pair, i):
        """The converter's two rows of unit i of `pair` straight from global memory into registers (v8's loads: a
        slot not read loads its cache's token 0, through L1), in _read_unit's register order."""
        n = self.cfg.n_block
        s, h, rb = self._unit(i)
        codes, sc = self._select_cache(caches, base + (2 * pair + s) * n >= k0p)
        c8 = ptid % 8
        stride = Uint64(Uint32(codes.layout.stride[0]))
        g_codes = codes.iterator.toint() + Int64(h * 256 + c8 * 8)
        g_ext = codes.iterator.toint() + Int64(cutlass.select_(h == 0, 192 + c8 * 8, 448 + c8 * 16))
        g_sc = sc.iterator.toint() + Int64(h * 4)
        words = cute.make_rmem_tensor((10, 2), Int32)
        scl = cute.make_rmem_tensor((2,), Int32)
        oks = cute.make_rmem_tensor((2,), cutlass.Boolean)
        for q in cutlass.range_constexpr(2):
            e = sRows[STAGE_ROWS * rb + ptid // 8 + 16 * q, pair & 1, s]
            ee = cutlass.max(e, 0)
            blk = Uint64(Uint32(ee >> PACK_BITS)) * stride
            tok = Uint32(ee & ((1 << PACK_BITS) - 1))
            row = blk + Uint64(tok * ROW_BYTES)
            for w0, g, imm in ((0, g_codes, 0), (2, g_codes, 64), (4, g_codes, 128), (6, g_ext, 0), (8, g_ext, 8)):
                v = ld_b64(Int64(row) + g, imm)
                words[w0, q], words[w0 + 1, q] = Int32(v), Int32(v >> 32)
            scl[q] = ld_b32(Int64(blk + Uint64(tok * 8)) + g_sc, 0)
            oks[q] = e >= 0
        return words, scl, oks
