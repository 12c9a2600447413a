"""The FP8 decode's producer (issue #25; decode_fused.py is the kernel's frame): a pair's raw rows kept
in flight by L2 prefetches (no registers, no shared memory), each half's row batches as a run-time loop,
each slot decoded once a pair, and one copy of the code for both stages and both halves of d.

Why (the v2 run, docs/perf/fmha.md): v2's kernel fit ~37 us fixed + ~9.3 us a 128-key pair a CTA where
its knock-out without FP8 loads fit ~17 + ~2.9: the fill is serialised behind the consumers' release
of the stages it fills, and it was ~2-3 dependent DRAM round trips (4-row register batches, 88
registers) plus ~3.3k instructions a thread of straight-line code. Shared memory cannot stage raw
rows (15 KB free < one 37 KB raw tile); L2 (50 MB) can: a pair's rows are 75 KB a CTA.

- Prefetch: each producer thread owns one slot of its tile (lt); once it knows that slot's token it
  issues `prefetch.global.L2` for each line of the token's contiguous 576-byte row (5 lines, 6 at
  most) and one for its scale row. Pair 0's rows after the slot barrier of pair 0; pair p + 1's at the
  end of pair p, from the token its own cp.async brought (`cp.async.wait_group 0`: a thread's own
  cp.async is visible to it), a whole consumer pair before the register loads ask.
- Loop: each half's row batches in a run-time loop, the batch's registers local to an iteration
  (registers carried across the loop went to local memory: 1.7k STL).
- One copy (v6): the stage (which 64 threads) and the half of d (left: code segments 0-3; right: 4-6 +
  the RoPE) are run-time values: one copy of the loads, conversion and stores instead of four (64 HMUL2,
  not 224; 1.034x FlashMLA against v5's 0.988: lesson 43). The right half's fourth segment is converted,
  then replaced by the RoPE (a select a word); its registers take segment 3's codes or the RoPE by two
  unconditional 8-byte loads from selected addresses (loads under a branch went to local memory).
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
from cutlass import BFloat16, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_fused import ROWS_PER_BATCH, FusedDecodeSm90, e4m3x2_to_bf16x2

ROW_BYTES = 576  # a token's codes + RoPE, contiguous (oracles/fmha_cache.py)
PACK_BITS = 10  # packed slots: block size <= 1024, blocks < 2^21 (decode_glue.run_fused checks)


@dsl_user_op
def ld_hinted(addr, bits: int, qual: str, *, loc=None, ip=None):
    """ld.global{qual}.b{bits} (32 or 64) of `addr`, kept in place (volatile)."""
    ty, c = (T.i64(), "l") if bits == 64 else (T.i32(), "r")
    v = llvm.inline_asm(ty, [Int64(addr).ir_value(loc=loc, ip=ip)], f"ld.global{qual}.b{bits} $0, [$1];", f"={c},l",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return Int64(v) if bits == 64 else Int32(v)


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None) -> None:
    """prefetch.global.L2 of the line holding `addr`."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];", "l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class FusedPackedLoop(FusedDecodeSm90):
    """The fused FP8 decode with the prefetching, looping, packed-slot, one-copy producer (module docstring)."""

    load_before_claim = False  # a half's batch loads issued before its empty wait (in the loop: one copy)
    load_hint = ""  # "": plain loads (autovec); else the qualifiers of ld.global (e.g. ".nc.L2::256B")

    @cute.jit
    def _prefetch_row(self, caches, second, v):
        """L2 prefetch of token v's row and scale row in cache 1 if `second` else cache 0; nothing for
        v < 0 (a slot not read)."""
        if v >= 0:
            codes, _, sc = self._select_cache(caches, second)
            bs = cute.size(codes, mode=[1])
            blk = v // bs
            tok = v - blk * bs
            row = codes[blk, tok, None].iterator.toint()
            # every line the row touches: 5 (FlashMLA's rows start 0 or 64 bytes into a line), 6 at most
            for k in cutlass.range_constexpr(5):
                prefetch_l2(row + k * 128)
            prefetch_l2(row + (ROW_BYTES - 1))
            prefetch_l2(sc[blk, tok, None].iterator.toint())

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
            mine = self._valid_token(caches, bidx, j0 + lt, rows[lt, buf])
            k0p = self._k0_padded(caches[3])
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
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)  # this thread's own copy of its next slot's token
                j1 = j0 + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + lt, rows[lt, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)

    @cute.jit
    def _half(self, cache, dst, rows, sIdx, sMaskFlag, mine, t, h, k, full, empty, phase, stage):
        """Half h of d of this thread's rows t // 8 + 8 q into dst (keys, d) after the wait for the half to
        be free; with the tile's first half (k = 0) its slot validity is published (the owner's mask read
        the previous indices before it freed that half). Every batch's loads wait one round trip (L2,
        after the prefetch): loading the first before the wait measured 35% slower (lesson 43)."""
        if cutlass.const_expr(not self.load_before_claim):
            self._claim_half(sIdx, sMaskFlag, mine, t, k, empty, phase, stage)
        first, count = self._batch_range(self.cfg.n_block // 8 // ROWS_PER_BATCH)
        for b in cutlass.range(first, first + count, unroll=1):
            regs = self._batch_regs()
            self._load_batch(cache, rows, t, b, h, *regs)
            if cutlass.const_expr(self.load_before_claim):
                if b == first:
                    self._claim_half(sIdx, sMaskFlag, mine, t, k, empty, phase, stage)
            for i in cutlass.range_constexpr(ROWS_PER_BATCH):
                self._store_row(dst, *regs, i, t // 8 + 8 * (b * ROWS_PER_BATCH + i), h, t % 8, full)
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        self._arrive_full(full, t)

    @staticmethod
    def _batch_regs():
        """A batch's registers: segments 0-2 (8 codes each), the half's scale bytes, `ext` (16 bytes a row:
        segment 3's 8 codes in the left half, the RoPE chunk in the right: one set of registers for
        both), the tokens."""
        br = ROWS_PER_BATCH
        return (cute.make_rmem_tensor((8, 3, br), cutlass.Float8E4M3FN), cute.make_rmem_tensor((4, br), cutlass.Uint8),
                cute.make_rmem_tensor((8, br), BFloat16), cute.make_rmem_tensor((br,), Int32))

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
    def _load_batch(self, cache, rows, t, b, h, raw, scl, ext, vs):
        """Batch b's rows (t // 8 + 8 (b br + i)) of half h into the registers; a slot not read (-1) loads
        its cache's token 0 (its values are replaced by zeros)."""
        codes, rope, sc = cache
        c8 = t % 8
        for i in cutlass.range_constexpr(ROWS_PER_BATCH):
            e = rows[t // 8 + 8 * (b * ROWS_PER_BATCH + i)]
            ee = cutlass.max(e, 0)
            blk, tok = ee >> PACK_BITS, ee & ((1 << PACK_BITS) - 1)
            vs[i] = e
            src = codes[blk, tok, None]
            for sg in cutlass.range_constexpr(3):
                self._load8(cute.local_tile(src, (8,), ((h * 4 + sg) * 8 + c8,)), raw[None, sg, i])
            # the fourth 16 bytes of registers: segment 3's 8 codes (left) or the RoPE chunk (right), by two
            # unconditional 8-byte loads from selected addresses (loads under a branch into one register
            # array sent it to local memory)
            rope_at = cute.local_tile(rope[blk, tok, None], (8,), (c8,)).iterator.toint()
            lo = cutlass.select_(h == 0, cute.local_tile(src, (8,), (3 * 8 + c8,)).iterator.toint(), rope_at)
            e8 = cute.recast_tensor(ext[None, i], cutlass.Float8E4M3FN)  # (16,)
            for part, addr in ((0, lo), (1, rope_at + 8)):
                g = cute.make_tensor(cute.make_ptr(cutlass.Float8E4M3FN, addr, cute.AddressSpace.gmem, assumed_align=8),
                                     cute.make_layout((8,)))
                self._load8(g, cute.local_tile(e8, (8,), (part,)))
            scale = cute.local_tile(sc[blk, tok, None], (4,), (h,))
            if cutlass.const_expr(self.load_hint == ""):
                cute.autovec_copy(scale, scl[None, i])
            else:
                cute.recast_tensor(scl, Int32)[i] = ld_hinted(scale.iterator.toint(), 32, self.load_hint)

    @cute.jit
    def _load8(self, src, dst):
        """8 bytes of codes (or RoPE) from global src into registers dst (8 e4m3)."""
        if cutlass.const_expr(self.load_hint == ""):
            cute.autovec_copy(src, dst)
        else:
            v = ld_hinted(src.iterator.toint(), 64, self.load_hint)
            w = cute.recast_tensor(dst, Int32)
            w[0] = Int32(v)
            w[1] = Int32(v >> 32)

    @cute.jit
    def _store_row(self, dst, raw, scl, ext, vs, i: cutlass.Constexpr, r, h, c8, full):
        """Batch slot i (tile row r) of half h converted to bf16 (code x 2^(e - 127), the fourth segment
        replaced by the RoPE chunk in the right half; zeros for a slot not read) and stored as the 16-byte
        chunk c8 of each segment into the swizzled tile (and, paired, the peer's: `full` is the half's
        full barrier)."""
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

    def _batch_range(self, n_batches: int):
        """(first, count) of the row batches of a half this CTA converts: all (a seam: decode_pair.py splits
        them; count is a trace-time constant)."""
        return 0, n_batches

    def _arrive_full(self, full, t):
        """Thread t's stores of the half are done (a seam: decode_pair.py adds the peer's bytes)."""
        cute.arch.mbarrier_arrive(full)

