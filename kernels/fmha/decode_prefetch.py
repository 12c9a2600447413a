"""The FP8 decode's producer (issue #25; decode_fused.py is the kernel's frame): a pair's raw rows kept
in flight by L2 prefetches (no registers, no shared memory), each half's row batches as a run-time loop,
each slot decoded once a pair, and one copy of the code for both stages and both halves of d.

Why (the v2 run, docs/perf/fmha.md): v2's kernel fit ~37 us fixed + ~9.3 us a 128-key pair a CTA where
its knock-out without FP8 loads fit ~17 + ~2.9: the fill is serialised behind the consumers' release
of the stages it fills, and it was ~2-3 dependent DRAM round trips (4-row register batches, 88
registers) plus ~3.3k instructions a thread of straight-line code. Shared memory cannot stage raw
rows (15 KB free < one 37 KB raw tile); L2 (50 MB) can: a pair's rows are 75 KB a CTA.

- Prefetch: each producer thread owns one slot of its tile (lt); once it knows that slot's token it
  issues `prefetch.global.L2` for each line of the token's 576-byte row (5-6) and one for its scale
  row (at h_q 128 the head pair splits them: decode_pair.FusedHeadPair._prefetch_lines). Pair 0's rows
  after the slot barrier of pair 0; pair p + 1's at the end of pair p, from the token its own
  cp.async brought (`cp.async.wait_group 0`: a thread's own cp.async is visible to it), a whole
  consumer pair before the register loads ask.
- Loop: each half's row batches in a run-time loop, the batch's registers local to an iteration
  (registers carried across the loop went to local memory: 1.7k STL).
- One copy (v6): the stage (which 64 threads) and the half of d (left: code segments 0-3; right: 4-6 +
  the RoPE) are run-time values: one copy of the loads, conversion and stores instead of four (64 HMUL2,
  not 224; 1.034x FlashMLA against v5's 0.988: lesson 43). The right half's fourth segment is converted,
  then replaced by the RoPE (a select a word); its registers take segment 3's codes or the RoPE by two
  unconditional 8-byte loads from a per-half base (loads under a branch went to local memory).
- Addresses (v7, `_half`): 816 -> 504 instructions a half-unit at h_q 128 (lesson 44); 1.126x FlashMLA
  against v6's 1.042x in one process.
- Packed slots: after the pair's slot barrier each thread decodes its own slot once (the slot rule,
  the division by the block size) into `block << 10 | token` or -1, writes it over its raw token and a
  second 64-thread barrier publishes the words; a row's loads then need a shift and a mask instead of
  ~50 instructions (block size <= 1024, < 2^21 blocks: run_fused checks).

Measured and removed (git history at e18977f): L1 prefetches of the next batches (4-10% slower at
64-128 requests). `cp.async.bulk.prefetch.L2` of a whole row is a uniform-datapath instruction that
ptxas wraps in a loop over the warp's 32 addresses.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_fused import ROWS_PER_BATCH, FusedDecodeSm90
from kernels.fmha.decode_ptx import e4m3x2_to_bf16x2, ld_b32, ld_b64, prefetch_l2, prmt, st_shared_v4

ROW_BYTES = 576  # a token's codes + RoPE, contiguous (oracles/fmha_cache.py)
# every line a row touches past its first: 5 in all (FlashMLA's rows start 0 or 64 bytes into a line), 6 at most
ROW_LINES = (128, 256, 384, 512, ROW_BYTES - 1)
PACK_BITS = 10  # packed slots: block size <= 1024, blocks < 2^21 (decode_glue.run_fused checks)
SEG_BYTES = 64 * 128  # one 64-column block of the K tile: 64 keys x 128 B


class FusedPackedLoop(FusedDecodeSm90):
    """The fused FP8 decode with the prefetching, looping, packed-slot, one-copy producer (module docstring)."""

    @cute.jit
    def _prefetch_row(self, caches, second, v):
        """L2 prefetch of token v's row and its scale row (`_prefetch_lines`) in cache 1 if `second` else cache 0;
        nothing for v < 0 (a slot not read)."""
        if v >= 0:
            codes, sc = self._select_cache(caches, second)
            bs = cute.size(codes, mode=[1])
            blk = v // bs
            tok = v - blk * bs
            self._prefetch_lines(codes[blk, tok, None].iterator.toint(), sc[blk, tok, None].iterator.toint())

    @cute.jit
    def _prefetch_lines(self, row, scales):
        """Every line of the row, then its scale row."""
        prefetch_l2(row)
        for off in ROW_LINES:
            prefetch_l2(row + off)
        prefetch_l2(scales)

    @cute.jit
    def _produce(self, caches, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles):
        """Threads 0-63 fill stage 0 (tiles 2p), 64-127 stage 1 (tiles 2p + 1), the stage a run-time value.
        The tiles' raw tokens go through smem: thread lt copies slot lt's (cp.async, a pair ahead, into
        the other of two buffers) and, after a barrier of the 64, packs its own; prefetches: pair 0's rows
        at its start, pair p + 1's at the end of pair p."""
        n = self.cfg.n_block
        stage = cute.arch.make_warp_uniform(ptid // n)
        lt = ptid - stage * n
        rows = sRows[None, None, stage]
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        # the request's list lengths, loaded once: read in the loop they were a dependent global load twice a
        # pair that its barriers kept the compiler from hoisting (~5% of the producer's ncu samples; once:
        # 1.177x FlashMLA against 1.163x in one process, run at d597124)
        lens = (caches[3][bidx], caches[7][bidx])
        k0p = self._k0_padded(caches[2])
        self._copy_slot(caches, rows[None, 0], bidx, base + stage * n + lt, lt)
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j0 = base + (2 * pair + stage) * n
            cute.arch.cp_async_wait_group(0)
            # every thread's copy of this pair landed; every read of the other buffer (last pair) is done
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._copy_slot(caches, rows[None, 1 - buf], bidx, j0 + 2 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            mine = self._valid_token(caches, lens, j0 + lt, rows[lt, buf])
            if pair == 0:
                self._prefetch_row(caches, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            bs = cute.size(cache[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            packed = (blk_m << PACK_BITS) | (mm - blk_m * bs)
            rows[lt, buf] = cutlass.select_(mine >= 0, packed, Int32(-1))
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            for k in cutlass.range(2, unroll=1):
                h = (stage + k) % 2  # stage 0 fills left first, stage 1 right first (the order they are freed)
                hb = stage * 2 + h
                self._half(cache, sK[None, None, stage], rows[None, buf], sIdx, sMaskFlag, mine, lt, h, k,
                           bars + hb, bars + 4 + hb, (pair & 1) ^ 1, stage)
            if pair + 1 < n_pairs:  # after the second half (after the first: 1.116x vs 1.159x, run at f43230f)
                self._prefetch_next(caches, rows, j0, lt, buf, lens, k0p)

    @cute.jit
    def _prefetch_next(self, caches, rows, j0, lt, buf, lens, k0p):
        """The next pair's row of this thread's slot into L2, from the token its own cp.async brought."""
        n = self.cfg.n_block
        cute.arch.cp_async_wait_group(0)  # this thread's own copy of its next slot's token
        j1 = j0 + 2 * n
        nxt = self._valid_token(caches, lens, j1 + lt, rows[lt, 1 - buf])
        self._prefetch_row(caches, j1 >= k0p, nxt)

    @cute.jit
    def _half(self, cache, dst, rows, sIdx, sMaskFlag, mine, t, h, k, full, empty, phase, stage):
        """Half h of d of this thread's rows t // 8 + 8 q into dst (keys, d) after the wait for the half to
        be free; with the tile's first half (k = 0) its slot validity is published (the owner's mask read
        the previous indices before it freed that half). Every batch's loads wait one round trip (L2,
        after the prefetch): loading the first before the wait measured 35% slower (lesson 43), and no
        faster in one copy (v6 and v7). Addresses (v7): the thread's rows share their swizzled 16-byte
        chunk `c8 ^ (t // 8)` (row t // 8 + 8 q is t // 8 modulo 8), so its stores are one base a half
        plus immediates (segment x 8 KB + row x 1 KB); its loads are three per-half bases (the codes of
        segments 0-2; the fourth chunk: segment 3's codes at 192 + 8 c8, or the RoPE at 448 + 16 c8, and
        the 8 bytes after it; the scales) plus two 32 x 32-bit products a row."""
        self._claim_half(sIdx, sMaskFlag, mine, t, k, empty, phase, stage)
        codes, sc = cache
        r0, c8 = t // 8, t % 8
        local = dst.iterator.toint() + h * (4 * SEG_BYTES) + r0 * 128 + ((c8 ^ r0) << 4)  # stage base: 1 KB aligned
        peer, peer_bar = self._peer_addresses(local, full)
        g_codes = codes.iterator.toint() + Int64(h * 256 + c8 * 8)
        g_ext = codes.iterator.toint() + Int64(cutlass.select_(h == 0, 192 + c8 * 8, 448 + c8 * 16))
        g_sc = sc.iterator.toint() + Int64(h * 4)
        stride = Uint64(Uint32(codes.layout.stride[0]))  # a block's bytes, scales too (< 2^32)
        first, count = self._batch_range(self.cfg.n_block // 8 // ROWS_PER_BATCH)
        for b in cutlass.range(first, first + count, unroll=1):
            words = cute.make_rmem_tensor((10, ROWS_PER_BATCH), Int32)  # segments 0-2: 2 words each; 4th chunk: 4
            scl = cute.make_rmem_tensor((ROWS_PER_BATCH,), Int32)
            oks = cute.make_rmem_tensor((ROWS_PER_BATCH,), cutlass.Boolean)
            for i in cutlass.range_constexpr(ROWS_PER_BATCH):
                e = rows[t // 8 + 8 * (b * ROWS_PER_BATCH + i)]
                ee = cutlass.max(e, 0)  # a slot not read loads its cache's token 0 (zeroed below)
                blk = Uint64(Uint32(ee >> PACK_BITS)) * stride
                tok = Uint32(ee & ((1 << PACK_BITS) - 1))
                row = blk + Uint64(tok * ROW_BYTES)
                for w0, g, imm in ((0, g_codes, 0), (2, g_codes, 64), (4, g_codes, 128), (6, g_ext, 0), (8, g_ext, 8)):
                    v = ld_b64(Int64(row) + g, imm)
                    words[w0, i], words[w0 + 1, i] = Int32(v), Int32(v >> 32)
                scl[i] = ld_b32(Int64(blk + Uint64(tok * 8)) + g_sc, 0)
                oks[i] = e >= 0
            at = b * (ROWS_PER_BATCH * 8 * 128)
            for i in cutlass.range_constexpr(ROWS_PER_BATCH):
                self._store_row(words, scl[i], oks[i], i, h, local + at, peer + at, peer_bar)
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        self._arrive_full(full, t)

    @cute.jit
    def _claim_half(self, sIdx, sMaskFlag, mine, t, k, empty, phase, stage):
        """Wait for the half to be free; with the tile's first half (k = 0) publish its slot validity
        for the consumers' mask: each slot's token (or -1), per warp whether all 32 slots are read."""
        cute.arch.mbarrier_wait(empty, phase)
        if k == 0:
            self._publish(sIdx, sMaskFlag, mine, t, stage)

    @cute.jit
    def _publish(self, sIdx, sMaskFlag, mine, t, stage):
        sIdx[t, stage] = mine
        warp_plain = Int32(cute.arch.vote_all_sync(mine >= 0))
        if t % 32 == 0:
            sMaskFlag[t // 32, stage] = warp_plain

    @cute.jit
    def _store_row(self, words, sw, ok, i: cutlass.Constexpr, h, local, peer, peer_bar):
        """Batch row i: each segment's 8 codes x 2^(e - 127) as 16 bytes at its immediate offset, here and
        (paired) in the peer; segment 3 of the right half is the RoPE chunk. A slot not read (not ok)
        gets scale 0, which zeroes its codes (the bit conversion makes every code finite), and RoPE 0."""
        w2 = cutlass.select_(ok, sw + 0x78787878, Int32(0))  # e + 120 a byte: no carries while e <= 135
        for sg in cutlass.range_constexpr(4):
            s2 = prmt(w2, Int32(0), 0x4040 + 0x101 * sg) << 7  # bf16x2 of 2^(e - 7)
            out = cute.make_rmem_tensor((4,), Int32)
            for wd in cutlass.range_constexpr(2):
                out[2 * wd] = e4m3x2_to_bf16x2(words[2 * sg + wd, i], 0x9180, s2)
                out[2 * wd + 1] = e4m3x2_to_bf16x2(words[2 * sg + wd, i], 0xB3A2, s2)
            if cutlass.const_expr(sg == 3):
                for q in cutlass.range_constexpr(4):
                    out[q] = cutlass.select_(h == 1, cutlass.select_(ok, words[6 + q, i], Int32(0)), out[q])
            vals = (out[0], out[1], out[2], out[3])
            st_shared_v4(local, sg * SEG_BYTES + i * 1024, vals)
            self._store_peer(vals, peer, sg * SEG_BYTES + i * 1024, peer_bar)

    def _batch_range(self, n_batches: int):
        """(first, count) of the row batches of a half this CTA converts: all (a seam: decode_pair.py splits
        them; count is a trace-time constant)."""
        return 0, n_batches

    def _arrive_full(self, full, t):
        """Thread t's stores of the half are done (a seam: decode_pair.py adds the peer's bytes)."""
        cute.arch.mbarrier_arrive(full)
