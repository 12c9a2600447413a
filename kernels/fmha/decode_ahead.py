"""Candidate producer of the FP8 decode (issue #25): a row's L2 prefetch two pairs ahead instead of one.

Why (v8's knock-outs, docs/perf/fmha.md): the producer alone (its consumers only hand the halves back) was
slower than the whole kernel at h_q 64 (58.3 vs 44.0 us at 128 requests, 8K): without the consumers' time
between the end of pair p (where v8 prefetches pair p + 1's rows) and pair p + 1's loads, the prefetch has
not landed. In the kernel that interval is one consumer pair; where it is short of a DRAM round trip
under load, the loads still miss. Two pairs ahead, the slot tokens come a pair earlier too: three token
buffers (v8: two), +512 bytes of shared memory.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_pair import FusedQTma
from kernels.fmha.decode_prefetch import PACK_BITS


class FusedPrefetchAhead(FusedQTma):
    """The default with the prefetch and the token copies two pairs ahead (module docstring)."""

    token_buffers = 3

    @cute.jit
    def _produce(self, caches, all_lines, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles):
        n = self.cfg.n_block
        stage = cute.arch.make_warp_uniform(ptid // n)
        lt = ptid - stage * n
        rows = sRows[None, None, stage]
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        lens = (caches[3][bidx], caches[7][bidx])
        k0p = self._k0_padded(caches[2])
        self._copy_slot(caches, rows[None, 0], bidx, base + stage * n + lt, lt)
        self._copy_slot(caches, rows[None, 1], bidx, base + (2 + stage) * n + lt, lt)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        if n_pairs > 1:  # pair 1's rows now (pair 0's: at its start, as v8)
            j1 = base + (2 + stage) * n
            self._prefetch_row(caches, all_lines, j1 >= k0p, self._valid_token(caches, lens, j1 + lt, rows[lt, 1]))
        buf = Int32(0)
        for pair in cutlass.range(n_pairs, unroll=1):
            j0 = base + (2 * pair + stage) * n
            ahead = cutlass.select_(buf == 0, Int32(2), buf - 1)  # (pair + 2) % 3: pair - 1's buffer, read by now
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._copy_slot(caches, rows[None, ahead], bidx, j0 + 4 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            mine = self._valid_token(caches, lens, j0 + lt, rows[lt, buf])
            if pair == 0:
                self._prefetch_row(caches, all_lines, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            bs = cute.size(cache[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            rows[lt, buf] = cutlass.select_(mine >= 0, (blk_m << PACK_BITS) | (mm - blk_m * bs), Int32(-1))
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            for k in cutlass.range(2, unroll=1):
                h = (stage + k) % 2
                hb = stage * 2 + h
                self._half(cache, sK[None, None, stage], rows[None, buf], sIdx, sMaskFlag, mine, lt, h, k,
                           bars + hb, bars + 4 + hb, (pair & 1) ^ 1, stage)
            if pair + 2 < n_pairs:  # pair + 2's row of this thread's slot, from its own copy
                cute.arch.cp_async_wait_group(0)
                j2 = j0 + 4 * n
                self._prefetch_row(caches, all_lines, j2 >= k0p,
                                   self._valid_token(caches, lens, j2 + lt, rows[lt, ahead]))
            buf = cutlass.select_(buf == 2, Int32(0), buf + 1)
