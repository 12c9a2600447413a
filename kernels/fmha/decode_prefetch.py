"""FP8 sparse decode v3 candidates (issue #25): the fused kernel (decode_fused.py, one_path + prmt
conversion = `cutedsl:fused-small`) with a producer that keeps many KB of raw rows in flight without
registers or shared memory, by prefetching them into L2.

Why (the v2 measurement, docs/perf/fmha.md): fused-small took ~13.7 us a 128-key pair at 128 Pro
requests where its knock-out without FP8 loads took ~4.5: the producer's fill of a pair is serialised
behind the consumers' release of the stages it fills (both K stages belong to one pair, and a half of
d is freed only after its PV), and that fill is ~2-3 dependent DRAM round trips (4-row register
batches, 88 registers) plus ~2.9k producer instructions streamed through a cold instruction cache.
Shared memory cannot stage raw rows (15 KB free < one 37 KB raw tile), but L2 (50 MB) can: a whole
pair of rows is 75 KB a CTA, ~10 MB for 132 CTAs.

`FusedPrefetch` (`cutedsl:fused-pf`): each producer thread owns one slot of its tile (lt); once it
knows that slot's token it issues `cp.async.bulk.prefetch.L2.global` of the token's contiguous
576-byte row (448 codes + 128 bytes of RoPE) and `prefetch.global.L2` of its 8-byte scale row: two
instructions, no registers held, no completion to wait for. Pair 0's rows are prefetched at the start
of pair 0 (after the slot barrier: its batch-1 and second-half loads then hit L2); pair p+1's rows at
the end of pair p, from the token its own cp.async brought (`cp.async.wait_group 0`: a thread's own
cp.async is visible to it; no barrier), i.e. a whole consumer pair (~4.5 us) before the producer's
register loads ask for them. The register batches, conversion and barriers are v2's unchanged.

`FusedPrefetchLoop` (`cutedsl:fused-pf-loop`): fused-pf with each half's row batches in a run-time
loop (not unrolled): batch 0's loads before the empty wait as before, then `for b: convert + store
batch b; load batch b + 1` into the same registers. One copy of the conversion per (stage, half)
instead of two: ~half the producer code (instruction cache), for one L2 round trip a batch that is
no longer overlapped with the previous batch's conversion.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_fused import FusedDecodeSm90, e4m3x2_to_bf16x2
from kernels.regs import pin

ROW_BYTES = 576  # a token's codes + RoPE, contiguous (oracles/fmha_cache.py)


@dsl_user_op
def prefetch_l2_bulk(addr, *, loc=None, ip=None) -> None:
    """cp.async.bulk.prefetch.L2 of the 576-byte row at `addr` (16-byte aligned: block strides are
    multiples of 16, rows 576 apart)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)],
                    f"cp.async.bulk.prefetch.L2.global [$0], {ROW_BYTES};", "l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None) -> None:
    """prefetch.global.L2 of the line holding `addr`."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];", "l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class FusedPrefetch(FusedDecodeSm90):
    """v2 (one producer path, prmt conversion) + L2 prefetch of each pair's rows (module docstring)."""

    batch_loop = False
    # True: one cp.async.bulk.prefetch.L2 of the row (a uniform-datapath instruction: ptxas wraps it in
    # a loop over the warp's distinct addresses, 32 trips); False: 5 prefetch.global.L2 a thread
    bulk_prefetch = False

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
            if cutlass.const_expr(self.bulk_prefetch):
                prefetch_l2_bulk(row)
            else:  # every line the row touches: 5 (FlashMLA's rows start 0 or 64 bytes into a line), 6 at most
                for k in cutlass.range_constexpr(5):
                    prefetch_l2(row + k * 128)
                prefetch_l2(row + (ROW_BYTES - 1))
            prefetch_l2(sc[blk, tok, None].iterator.toint())

    @cute.jit
    def _produce_fp8_tiles(self, caches, sK, sRows, sIdx, sMaskFlag, bars, lt, blk, bidx, n_idx, n_tiles,
                           stage: cutlass.Constexpr):
        """decode_fused's loop (one_path) with the prefetches: pair 0's rows at its start, pair p + 1's
        at the end of pair p."""
        n = self.cfg.n_block
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        self._copy_slot(caches, sRows[None, 0], bidx, base + stage * n + lt, lt)
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j0 = base + (2 * pair + stage) * n
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._copy_slot(caches, sRows[None, 1 - buf], bidx, j0 + 2 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            t = pin(lt)
            mine = self._valid_token(caches, bidx, j0 + t, sRows[t, buf])
            k0p = self._k0_padded(caches[3])
            if pair == 0:
                self._prefetch_row(caches, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            self._dequant_tile(cache, caches, sK[None, None, stage], sRows[None, buf], sIdx, sMaskFlag, mine,
                               bidx, j0, t, bars, (pair & 1) ^ 1, stage)
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)  # this thread's own copy of its next slot's token
                j1 = j0 + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + t, sRows[t, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)

    @cute.jit
    def _dequant_half(self, cache, caches, dst, rows, sIdx, sMaskFlag, mine, bidx, j0, t, h: cutlass.Constexpr, full,
                      empty, phase, stage: cutlass.Constexpr, publish: cutlass.Constexpr):
        if cutlass.const_expr(not self.batch_loop):
            FusedDecodeSm90._dequant_half(self, cache, caches, dst, rows, sIdx, sMaskFlag, mine, bidx, j0, t, h,
                                          full, empty, phase, stage, publish)
        else:
            self._dequant_half_loop(cache, caches, dst, rows, sIdx, sMaskFlag, mine, bidx, j0, t, h, full, empty,
                                    phase, stage, publish)

    @cute.jit
    def _load_batch(self, cache, caches, rows, bidx, j0, t, b, raw, scl, rp, vs, h: cutlass.Constexpr):
        """Batch b's rows (t // 8 + 8 (b br + i)) into the registers; a slot not read loads its cache's
        token 0 and is marked -1 in vs."""
        codes, rope, sc = cache
        br = self.rows_per_batch
        n_code = 4 if h == 0 else 3
        for i in cutlass.range_constexpr(br):
            r = t // 8 + 8 * (b * br + i)
            v = self._valid_token(caches, bidx, j0 + r, rows[r])
            vs[i] = v
            self._load_row(codes, rope, sc, cutlass.max(v, 0), raw, scl, rp, i, h, n_code, t % 8)

    @cute.jit
    def _dequant_half_loop(self, cache, caches, dst, rows, sIdx, sMaskFlag, mine, bidx, j0, t, h: cutlass.Constexpr,
                           full, empty, phase, stage: cutlass.Constexpr, publish: cutlass.Constexpr):
        """decode_fused._dequant_half (prmt conversion) with the batches in a run-time loop, each
        batch's registers local to its iteration (registers carried across a run-time loop went to
        local memory: 1.7k STL): one copy of the loads and the conversion; the empty wait comes first,
        so every batch's loads wait one (L2, after the prefetch) round trip."""
        br = self.rows_per_batch
        n_batches = self.cfg.n_block // 8 // br
        n_code = 4 if h == 0 else 3
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        cute.arch.mbarrier_wait(empty, phase)
        if cutlass.const_expr(publish):
            sIdx[t, stage] = mine
            warp_plain = Int32(cute.arch.vote_all_sync(mine >= 0))
            if t % 32 == 0:
                sMaskFlag[t // 32, stage] = warp_plain
        for b in cutlass.range(n_batches, unroll=1):
            raw = cute.make_rmem_tensor((8, 4, br), cutlass.Float8E4M3FN)
            scl = cute.make_rmem_tensor((4, br), cutlass.Uint8)
            rp = cute.make_rmem_tensor((8, br), BFloat16)
            vs = cute.make_rmem_tensor((br,), Int32)
            self._load_batch(cache, caches, rows, bidx, j0, t, b, raw, scl, rp, vs, h)
            for i in cutlass.range_constexpr(br):
                r = t // 8 + 8 * (b * br + i)
                for sg in cutlass.range_constexpr(4):
                    vals = cute.make_rmem_tensor((8,), BFloat16)
                    if cutlass.const_expr(sg < n_code):
                        e = Int32(scl[sg, i])
                        hb = (e + 120) << 7  # bf16 bits of 2^(e - 7)
                        scale2 = hb | (hb << 16)
                        words = cute.recast_tensor(raw, Int32)  # (2, 4, br): 4 codes a word
                        out = cute.recast_tensor(vals, Int32)  # (4,): 2 bf16 a word
                        for wd in cutlass.range_constexpr(2):
                            w = cutlass.select_(vs[i] >= 0, words[wd, sg, i], Int32(0))
                            out[2 * wd] = e4m3x2_to_bf16x2(w, 0x9180, scale2)
                            out[2 * wd + 1] = e4m3x2_to_bf16x2(w, 0xB3A2, scale2)
                    else:
                        vals.store(rp[None, i].load())
                        if vs[i] < 0:
                            vals.fill(0.0)
                    chunk = (h * 4 + sg) * 8 + t % 8
                    cute.copy(st_atom, vals, cute.local_tile(dst[r, None], (8,), (chunk,)))
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the consumers' wgmma
        cute.arch.mbarrier_arrive(full)


class FusedPrefetchBulk(FusedPrefetch):
    """fused-pf with one cp.async.bulk.prefetch.L2 a row instead of 5 line prefetches."""

    bulk_prefetch = True


class FusedPrefetchLoop(FusedPrefetch):
    """fused-pf with each half's row batches in a run-time loop (one copy of the conversion)."""

    batch_loop = True
