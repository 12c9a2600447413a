"""Candidate (issue #25): the FP8 decode's producer as one warpgroup filling one tile at a time.

v7's producer gives each K stage its own 64 threads: the threads of stage s fill tile 2p + 2 only once
the consumers have freed tile 2p, and take a whole group-time P for it (64 threads) while the
consumers run one tile C: two tiles every C + P. Over v7 at h_q 128, 128 requests the producer alone
took 90 us, the consumers alone 74 and the kernel 112 (docs/perf/fmha.md). Here all 128 threads fill
tile 2p, then 2p + 1, each tile in ~P / 2: while the consumers run tile j the producer fills j + 1, so
the period is max(C, P / 2) (FlashMLA's producer warpgroup fills one K buffer at a time likewise).
Slot ownership is v7's (thread t owns slot t % 64 of the tiles of stage t // 64: the token copies a pair
ahead, the packing, the prefetches, the published indices); the barriers of a pair's slot hand-off
span all 128 threads; a tile's rows are t // 8 + 16 q (4 a thread and half, 2 in a head pair's CTA).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.decode_pair import FusedQTma
from kernels.fmha.decode_prefetch import PACK_BITS


class WholeTile(FusedQTma):
    """The default FP8 decode (decode_pair.FusedQTma) with the whole-warpgroup producer (module docstring)."""

    tile_threads = 128

    @cute.jit
    def _produce(self, caches, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles):
        n = self.cfg.n_block
        own = cute.arch.make_warp_uniform(ptid // n)  # the stage whose slots this thread owns
        lt = ptid - own * n
        mine_rows = sRows[None, None, own]
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        self._copy_slot(caches, mine_rows[None, 0], bidx, base + own * n + lt, lt)
        cute.arch.cp_async_commit_group()
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j_own = base + (2 * pair + own) * n
            cute.arch.cp_async_wait_group(0)
            # every thread's copy of this pair landed; every read of the other buffer (last pair) is done
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0, number_of_threads=128)
            self._copy_slot(caches, mine_rows[None, 1 - buf], bidx, j_own + 2 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            mine = self._valid_token(caches, bidx, j_own + lt, mine_rows[lt, buf])
            k0p = self._k0_padded(caches[3])
            if pair == 0:
                self._prefetch_row(caches, j_own >= k0p, mine)
            bs = cute.size(self._select_cache(caches, j_own >= k0p)[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            mine_rows[lt, buf] = cutlass.select_(mine >= 0, (blk_m << PACK_BITS) | (mm - blk_m * bs), Int32(-1))
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0, number_of_threads=128)
            for s in cutlass.range(2, unroll=1):  # tile 2 pair + s in stage s, all 128 threads
                cache = self._select_cache(caches, base + (2 * pair + s) * n >= k0p)
                for k in cutlass.range(2, unroll=1):
                    h = (s + k) % 2  # stage 0 fills left first, stage 1 right first (the order they are freed)
                    hb = s * 2 + h
                    self._half(cache, sK[None, None, s], sRows[None, buf, s], sIdx, sMaskFlag, mine, ptid, h, k,
                               bars + hb, bars + 4 + hb, (pair & 1) ^ 1, s)
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)  # this thread's own copy of its next slot's token
                j1 = j_own + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + lt, mine_rows[lt, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)
