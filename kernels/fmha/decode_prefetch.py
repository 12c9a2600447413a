"""The FP8 decode's producer (issue #25, v3 `fused-pk-loop`; decode_fused.py is the kernel's
frame): a pair's raw rows kept in flight by L2 prefetches (no registers, no shared memory), each half's
row batches as a run-time loop (one copy of the conversion code), and each slot decoded once a pair.

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
from cutlass.cutlass_dsl import dsl_user_op

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_fused import ROWS_PER_BATCH, FusedDecodeSm90

ROW_BYTES = 576  # a token's codes + RoPE, contiguous (oracles/fmha_cache.py)
PACK_BITS = 10  # packed slots: block size <= 1024, blocks < 2^21 (decode_glue.run_fused checks)


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None) -> None:
    """prefetch.global.L2 of the line holding `addr`."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];", "l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class FusedPackedLoop(FusedDecodeSm90):
    """The fused FP8 decode with the prefetching, looping, packed-slot producer (module docstring)."""

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
    def _produce_fp8_tiles(self, caches, sK, sRows, sIdx, sMaskFlag, bars, lt, blk, bidx, n_idx, n_tiles,
                           stage: cutlass.Constexpr):
        """Tile 2p + stage of every pair p into `stage` by 64 threads. The tiles' raw tokens go through
        smem: thread lt copies slot lt's (cp.async, a pair ahead, into the other of two buffers) and,
        after a barrier of the 64, packs its own; prefetches: pair 0's rows at its start, pair p + 1's
        at the end of pair p."""
        n = self.cfg.n_block
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        self._copy_slot(caches, sRows[None, 0], bidx, base + stage * n + lt, lt)
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j0 = base + (2 * pair + stage) * n
            t, mine = self._pair_tokens(caches, sRows, bidx, lt, j0, buf, stage)
            k0p = self._k0_padded(caches[3])
            if pair == 0:
                self._prefetch_row(caches, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            bs = cute.size(cache[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            packed = (blk_m << PACK_BITS) | (mm - blk_m * bs)
            sRows[t, buf] = cutlass.select_(mine >= 0, packed, Int32(-1))  # every raw read of buf is done
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._dequant_tile(cache, caches, sK[None, None, stage], sRows[None, buf], sIdx, sMaskFlag, mine,
                               bidx, j0, t, bars, (pair & 1) ^ 1, stage)
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)  # this thread's own copy of its next slot's token
                j1 = j0 + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + t, sRows[t, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)

    @cute.jit
    def _load_batch(self, cache, caches, rows, bidx, j0, t, b, raw, scl, rp, vs, h: cutlass.Constexpr):
        """Batch b's rows (t // 8 + 8 (b br + i)) into the registers; a slot not read loads its cache's
        token 0 and is marked -1 in vs."""
        codes, rope, sc = cache
        br = ROWS_PER_BATCH
        n_code = 4 if h == 0 else 3
        for i in cutlass.range_constexpr(br):
            r = t // 8 + 8 * (b * br + i)
            v, blk, tok = self._row_of(cache, caches, rows, bidx, j0, r)
            vs[i] = v
            self._load_row_at(codes, rope, sc, blk, tok, raw, scl, rp, i, h, n_code, t % 8)

    @cute.jit
    def _row_of(self, cache, caches, rows, bidx, j0, r):
        """Row r of the tile: (v, block, token in block) from the owner's packed word, v < 0 for a slot
        not read (then block and token are its cache's token 0)."""
        e = rows[r]
        ee = cutlass.max(e, 0)
        return e, ee >> PACK_BITS, ee & ((1 << PACK_BITS) - 1)

    @cute.jit
    def _dequant_half(self, cache, caches, dst, rows, sIdx, sMaskFlag, mine, bidx, j0, t, h: cutlass.Constexpr, full,
                      empty, phase, stage: cutlass.Constexpr, publish: cutlass.Constexpr):
        """Half h of d of this thread's rows t // 8 + 8 q into dst (keys, d), the batches in a run-time
        loop; publishes the tile's slot validity with the first half (the owner's mask read the previous
        indices before it freed that half). The empty wait comes first, so every batch's loads wait one
        (L2, after the prefetch) round trip (loading the first batch before it measured 35% slower at
        h_q 64: docs/lessons/fmha.md 43)."""
        n_batches = self.cfg.n_block // 8 // ROWS_PER_BATCH
        self._wait_and_publish(empty, phase, sIdx, sMaskFlag, mine, t, stage, publish)
        first, count = self._batch_range(n_batches)
        self._batch_loop(cache, caches, dst, rows, bidx, j0, t, h, full, first, count)
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        self._arrive_full(full, t)

    @cute.jit
    def _batch_loop(self, cache, caches, dst, rows, bidx, j0, t, h: cutlass.Constexpr, full, first, count: int):
        """Batches first .. first + count - 1, each loaded, converted and stored, its registers local to an
        iteration (registers carried across a run-time loop went to local memory: 1.7k STL)."""
        for b in cutlass.range(first, first + count, unroll=1):
            regs = self._batch_regs()
            self._load_batch(cache, caches, rows, bidx, j0, t, b, *regs, h)
            self._store_batch(dst, regs, b, t, h, full)

    @staticmethod
    def _batch_regs():
        """A batch's registers: codes (8 a segment, 4 segments), the half's scale bytes, RoPE, tokens."""
        br = ROWS_PER_BATCH
        return (cute.make_rmem_tensor((8, 4, br), cutlass.Float8E4M3FN), cute.make_rmem_tensor((4, br), cutlass.Uint8),
                cute.make_rmem_tensor((8, br), BFloat16), cute.make_rmem_tensor((br,), Int32))

    @cute.jit
    def _store_batch(self, dst, regs, b, t, h: cutlass.Constexpr, full):
        br = ROWS_PER_BATCH
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        for i in cutlass.range_constexpr(br):
            self._store_row(dst, *regs, i, t // 8 + 8 * (b * br + i), h, 4 if h == 0 else 3, t % 8, st_atom, full)

    def _batch_range(self, n_batches: int):
        """(first, count) of the row batches of a half this CTA converts: all (a seam: decode_pair.py splits
        them; count is a trace-time constant)."""
        return 0, n_batches

    def _arrive_full(self, full, t):
        """Thread t's stores of the half are done (a seam: decode_pair.py adds the peer's bytes)."""
        cute.arch.mbarrier_arrive(full)

