"""v25 (prefill candidate; GroupedConfig.widen_pair, variant `cutedsl:v25`): v24 (kernels/moe/grouped_split.py) as
2-CTA clusters sharing the widened weight tile.

ncu on v24 (capped Pro T = 4096, L1): the three widener warps are awake every sampled cycle and the consumers sleep
on the widened tile's barrier ~17 times a block: the widening binds. Widening half of each tile (the knock-out
`:v24-ko-half-widen`) took L1 2501 -> 2057 us (no widening at all: 1898). Two m tiles of one expert read the same
weight tile, so a CTA pair can each widen half of it and store that half into both CTAs' B buffers.

Work: pair unit u = (pair q, n tile), n fastest, dealt to the clusters; CTA rank r of the pair runs m tile 2q + r.
Where tile 2q + 1 holds no row (the last pair of an odd count) rank 1 runs tile 2q again and stores nothing (a
ghost), so both CTAs walk the same K blocks and their B buffers' phases agree. A pair is shared where both tiles are
one expert's; otherwise (a pair across an expert boundary, a ghost's) each CTA widens its whole tile for itself.

Barriers of B buffer b, per CTA:
  full   WIDENER_WARPS arrivals (v24: one a widener warp, after its local stores and the proxy fence); shared, the
         first warp's is an arrive.expect_tx of the PEER_BYTES the pair's st.async complete (a complete_tx may land
         before the expect: the count is signed, the phase still waits for the local arrivals).
  empty  one arrive a consumer warp of this CTA and one of the pair's, at every block (shared or not): a widener
         stores into both CTAs' buffers, so it waits until both have read them.
The TMA ring, the consumers and the epilogues are v24's. A cluster barrier after the barriers' init (no remote store
or arrive reaches an uninitialised barrier) and one at exit (no CTA leaves while its pair may still store into it).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from kernels.cluster_ptx import bulk_copy_to_peer, mapa_u32
from kernels.gemm.tiling import KBLOCK
from kernels.moe.grouped_config import BN, WIDENER_WARPS
from kernels.moe.grouped_split import WIDENER_BARRIER, GroupedSplitRow

PEER_BYTES = BN // 2 * KBLOCK  # the half of a widened tile the pair stores into this CTA's B buffer


class GroupedPair(GroupedSplitRow):
    def _grid(self, units, n_ctas):
        """Two CTAs a pair unit (`units`, the host's bound, counts single m tiles: about twice the pairs), at most
        one CTA an SM."""
        return 2 * cutlass.min((units + 1) // 2, n_ctas // 2)

    @cute.jit
    def _work(self, st, mGroup, n_groups, tiles_m, mg, tidx):
        """Pairs of the tiles holding rows (the contiguous layout's prefix)."""
        return (GroupedSplitRow._work(self, st, mGroup, n_groups, tiles_m, mg, tidx) + 1) // 2

    @cute.jit
    def _second(self, t0, mg, mGroup):
        """Tile t0 + 1 holds rows (its first row is real: the tiles holding rows are a prefix)."""
        second = cutlass.Boolean(False)
        if (t0 + 1) * self.cfg.bm < mg:
            second = mGroup[(t0 + 1) * self.cfg.bm] >= 0
        return second

    @cute.jit
    def _unit(self, u, tiles_n, n_groups, mg, mGroup, st):
        """Pair unit u -> this CTA's (group 0, m tile, n tile, expert, rows stored: 0 for a ghost)."""
        bm = self.cfg.bm
        nt = u % tiles_n
        t0 = u // tiles_n * 2
        rank = cute.arch.block_idx_in_cluster()
        second = self._second(t0, mg, mGroup)
        mt = t0 + cutlass.select_(second, rank, 0)
        limit = cutlass.select_(second | (rank == 0), mg, 0)
        return Int32(0), mt, nt, mGroup[mt * bm], limit

    @cute.jit
    def _shared(self, u, tiles_n, mg, mGroup):
        """Both tiles of pair unit u are one expert's: each CTA widens half of the weight tile for both."""
        t0 = u // tiles_n * 2
        shared = cutlass.Boolean(False)
        if self._second(t0, mg, mGroup):
            shared = mGroup[t0 * self.cfg.bm] == mGroup[(t0 + 1) * self.cfg.bm]
        return shared

    @cute.jit
    def _widen_loop(self, ring, st, sSh, mTab, units, n_kb, bidx, gdim, wtid, where):
        """v24's widener loop over the cluster's pair units: per block wait for the stage and for B buffer g % nb to
        be free in both CTAs (`empty`), widen this rank's half of a shared tile into both B buffers (the pair's by
        st.async onto its full barrier), or the whole tile into this CTA's; fence, one arrive a warp."""
        c = self.cfg
        tiles_n, mg, mGroup = where
        threads = 32 * WIDENER_WARPS
        half = c.bn // 2
        tab = self._widener_table(st, mTab, wtid)
        wb = st.wbars.data_ptr()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        local_b = st.sB.data_ptr().toint()
        peer_b = mapa_u32(local_b, 1 - rank)
        peer_full = mapa_u32(wb.toint(), 1 - rank)
        g = Int32(0)
        for u in cutlass.range(bidx, units, gdim, unroll=1):
            shared = self._shared(u, tiles_n, mg, mGroup)
            for _kb in cutlass.range(0, n_kb, unroll=1):
                state = self._stage(g)
                buf, phase = self._buffer(g)
                ring.consumer_wait(state)
                cute.arch.mbarrier_wait(wb + c.widen_buffers + buf, phase ^ 1)  # empty in both CTAs
                if shared:
                    if cutlass.const_expr(c.pair_bulk or c.ablate == "no-peer"):
                        self._widen_rows(st, sSh, tab, state.index, buf, rank * half, wtid, threads, half,
                                         c.widen_batch)
                    else:
                        self._widen_rows(st, sSh, tab, state.index, buf, rank * half, wtid, threads, half,
                                         c.widen_batch, (peer_b, peer_full + 8 * buf))
                else:
                    self._widen_rows(st, sSh, tab, state.index, buf, 0, wtid, threads, c.bn, c.widen_batch)
                cute.arch.fence_proxy("async.shared", space="cta")
                if cutlass.const_expr(c.pair_bulk):  # every widener's half stored and fenced, then one bulk copy
                    if shared:
                        pipeline.NamedBarrier(barrier_id=WIDENER_BARRIER, num_threads=threads).arrive_and_wait()
                        if wtid == 0:
                            off = (buf * c.bn + rank * half) * KBLOCK
                            bulk_copy_to_peer(peer_b + off, local_b + off, PEER_BYTES, peer_full + 8 * buf)
                cute.arch.sync_warp()
                if cute.arch.lane_idx() == 0:
                    if shared & (wtid < 32) & cutlass.const_expr(c.ablate != "no-peer"):
                        cute.arch.mbarrier_arrive_and_expect_tx(wb + buf, PEER_BYTES)
                    else:
                        cute.arch.mbarrier_arrive(wb + buf)
                g = g + 1

    @cute.jit
    def _release(self, ring, st, state, g_rd):
        """The block's last wave is done: free its stage, and its B buffer in both CTAs (one arrive a consumer warp
        here and one in the pair's; the rank read before lane 0's branch, lesson fmha 50)."""
        ring.consumer_release(state)
        peer = 1 - cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        empty = st.wbars.data_ptr() + self.cfg.widen_buffers + self._buffer(g_rd)[0]
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(empty)
            cute.arch.mbarrier_arrive(empty, peer)


class GroupedL1Pair(GroupedPair):
    """Layer 1 of v25."""


class GroupedL2Pair(GroupedPair):
    """Layer 2 of v25."""
