"""A 2-CTA cluster form of the fused FP8 decode at h_q 128 (issue #25, part of v5 and the default): the two
64-head blocks of one (split, request) read the same key rows, and each CTA of the pair dequantised all
of them (v4: ~8 us a 128-key pair a CTA at h_q 128 as at 64, the tensor cores needing ~2.2). Paired,
each CTA converts half of every tile's rows (batch `rank` of the half's two 4-row batches: rows
t // 8 + 8 q, q in [4 rank, 4 rank + 4)) and stores each 16-byte chunk twice: into its own stage and,
by `st.async` with `complete_tx`, into the peer's (FlashMLA's SM90 FP8 decode shares a tile the same way).

Barriers of a K half (stage s, half h), per CTA:
  full   64 arrivals (its own producer threads, after their local stores), one of them an
         arrive.expect_tx of the peer's bytes (64 threads x 4 rows x 4 chunks x 16 B = 16 KB); the
         peer's st.async complete those bytes (a complete_tx may land before the expect: the count
         is signed, and the phase still waits for the 64 local arrivals).
  empty  8 arrivals: one a warp of its own consumer warpgroup and of the peer's (a remote arrive at the
         default CTA scope: no MEMBAR, lesson 41; 256, one a thread, until v8). A producer writes into
         both CTAs' stages, so it waits until both have read them.
A cluster barrier after the barriers' init (no remote arrive or store reaches an uninitialised
barrier) and one at exit (no CTA leaves while its peer may still store into it or arrive on it).
The slot hand-off, packing, the mask's indices and the consumers are per CTA, unchanged. The L2 prefetch of a
row is split between the pair (`_prefetch_lines`; v10): each CTA's producer knows the same tokens, and each
had prefetched every row, 14 prefetches a row where 7 do.
Where there is one head block (h_q 64) the form compiles to v4's code.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from kernels.fmha.decode_forms import FusedEpiTma, QByTma
from kernels.fmha.decode_fused import ROWS_PER_BATCH
from kernels.fmha.decode_prefetch import ROW_LINES, FusedPackedLoop
from kernels.fmha.decode_ptx import mapa_u32, prefetch_l2, st_async_v4
from kernels.fmha.prefill_v11 import V12

PEER_BYTES = 64 * ROWS_PER_BATCH * 4 * 16  # what the peer stores into a K half of this CTA a tile


class FusedHeadPair(FusedEpiTma):
    """v4 (fused-pk-epi) with the two head blocks of a (split, request) as a (1, 2, 1) cluster sharing
    the dequantisation (module docstring)."""

    def _paired(self) -> bool:
        return self.cfg.n_hblk == 2

    def _cluster_launch(self) -> dict:
        return {"cluster": [1, 2, 1]} if self._paired() else {}

    def _empty_count(self) -> int:
        return 8 if self._paired() else 128

    def _cluster_sync(self, at_exit: bool):
        """At init relaxed (fence.mbarrier_init already released the barriers); at exit a release, so
        this CTA's remote stores and arrives are ordered before the peer may leave."""
        if cutlass.const_expr(self._paired()):
            if cutlass.const_expr(at_exit):
                cute.arch.cluster_arrive()
            else:
                cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()

    def _batch_range(self, n_batches: int):
        if cutlass.const_expr(self._paired()):
            assert n_batches == 2, n_batches
            return cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()), 1
        return 0, n_batches

    def _peer_addresses(self, local, full):
        """The peer's shared::cluster addresses of this thread's store base and of the half's full barrier:
        the same offsets in the peer (`mapa`), so each store keeps its immediate offset."""
        if cutlass.const_expr(self._paired()):
            peer = 1 - cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            return mapa_u32(local, peer), mapa_u32(full.toint(), peer)
        return local, Int32(0)

    def _store_peer(self, vals, peer, imm, peer_bar):
        """The same 16 bytes into the peer's stage, completing on its full barrier (st.async)."""
        if cutlass.const_expr(self._paired()):
            st_async_v4(peer, imm, vals, peer_bar)

    @cute.jit
    def _arrive_full(self, full, t):
        if cutlass.const_expr(self._paired()):
            if t == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(full, PEER_BYTES)
            else:
                cute.arch.mbarrier_arrive(full)
        else:
            cute.arch.mbarrier_arrive(full)

    @cute.jit
    def _prefetch_lines(self, row, scales):
        """Paired, each row's prefetches once between the CTAs: rank 0 its first line and lines 2, 4; rank 1 its
        scale row, lines 1, 3 and its last byte (H200: 1.201-1.214x FlashMLA geomean over three processes, min
        1.023-1.029, against 1.185-1.196x, min 0.981-0.990, for every CTA prefetching every row; v10)."""
        if cutlass.const_expr(self._paired()):
            # the rank read plainly: make_warp_uniform here, under the caller's per-thread `v >= 0`, compiled to
            # WARPSYNC.ALL that lanes off the branch never reach (a stalled GPU test; lesson fmha 50)
            if cute.arch.block_idx_in_cluster() == 0:
                prefetch_l2(row)
                for off in ROW_LINES[1::2]:
                    prefetch_l2(row + off)
            else:
                prefetch_l2(scales)
                for off in ROW_LINES[0::2]:
                    prefetch_l2(row + off)
        else:
            FusedPackedLoop._prefetch_lines(self, row, scales)  # explicit: the DSL re-parses jit bodies

    @cute.jit
    def _release(self, bar):
        """Paired, a consumer warp frees a K half with one arrive here and one in the peer (lane 0, after a warp
        sync; the wgmma wait before it is the warpgroup's, so every read of the half is done), not 128 + 128 a
        warpgroup (v8: h_q 128 +0.3-1.8% in 13 of 16 comparisons over two processes; one arrive a warp
        unpaired measured 0.3-2% slower, so h_q 64 keeps the per-thread arrive)."""
        if cutlass.const_expr(self._paired()):
            peer = 1 - cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # before lane 0's branch
            cute.arch.sync_warp()
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(bar)
                cute.arch.mbarrier_arrive(bar, peer)
        else:
            cute.arch.mbarrier_arrive(bar)


class FusedHeadPairPdl(FusedHeadPair):
    """fused-pk-pair with the combine launched by programmatic dependent launch (decode_combine `pdl`),
    this kernel letting it start at once: the combine's launch and ramp overlap the attention kernel
    where it leaves SMs idle (1-32 requests: 5-128 CTAs)."""

    pdl_combine = True


class FusedQTma(QByTma, FusedHeadPairPdl):
    """The default FP8 decode (glue.py): the producer (decode_prefetch.py: one copy since v6), v4's TMA
    epilogue storing O a 64-column tile at a time as the prefill's v12 does (v9; H200 1.182x FlashMLA geomean
    against v8's 1.175x in one process), the head pair (its prefetch split since v10), the combine by PDL, Q by
    TMA (decode_forms.QByTma)."""

    o_tile_cols = V12.o_tile_cols
