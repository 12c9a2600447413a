"""The grouped expert GEMM's work list (kernels/moe/grouped_sm90.py, a mixin of GroupedSm90; `self.cfg` is its
GroupedConfig). The kernel is persistent: every CTA finds the tiles that hold rows (masked: a prefix sum of the
groups' tile counts in shared memory; contiguous: the prefix's end), and unit u = (tile, n tile), n fastest, is dealt
round-robin, so empty experts and padding cost nothing and the few units of a decode step spread over the SMs evenly.
Split-K (GroupedConfig.split_k) deals the tail units' K slices as further items (kernels/moe/grouped_slices.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from kernels.indexer.topk_select import warp_inclusive_scan
from kernels.moe.grouped_config import MAX_GROUPS
from kernels.moe.grouped_slices import item_range
from kernels.split_merge import add_and_count

SCAN_PER_LANE = MAX_GROUPS // 32  # `_work`'s masked scan: groups a lane of warp 0


@cute.jit
def last_group(gf, n_groups, key, per_tile=None):
    """The last group g with gf[g] (· per_tile) <= key (gf: the groups' first tiles, a prefix sum; a binary search of
    MAX_GROUPS' bit length steps): the group owning tile `key` (per_tile = the n tiles: unit `key`); empty groups,
    whose gf equals the next one's, are passed over."""
    lo, hi = Int32(0), n_groups - 1
    for _ in cutlass.range_constexpr(MAX_GROUPS.bit_length()):
        if lo < hi:
            mid = (lo + hi + 1) // 2
            first = gf[mid]
            if cutlass.const_expr(per_tile is not None):
                first = first * per_tile
            if first <= key:
                lo = mid
            else:
                hi = mid - 1
    return lo


class GroupedWorkList:
    @cute.jit
    def _work(self, st, mGroup, n_groups, tiles_m, mg, tidx):
        """Tiles holding rows. Masked: gtiles[g] = ceil(min(count_g, Mg) / bm) and gfirst[g] their exclusive
        prefix, by warp 0 alone (lane l: groups 16 l .. 16 l + 15, its counts' loads issued together, then a
        shuffle scan of the lanes' sums) and one CTA barrier. v1-v9 had every thread sum its groups' predecessors:
        O(E) dependent shared reads on the critical path after griddepcontrol.wait, ~1-2 us at 256-384 experts.
        Contiguous: the first tile whose first row is padding (binary search of the expert ids)."""
        c = self.cfg
        if cutlass.const_expr(c.layout == "masked"):
            gt = st.gtiles.get_tensor(cute.make_layout((MAX_GROUPS,)))
            gf = st.gfirst.get_tensor(cute.make_layout((MAX_GROUPS,)))
            if tidx < 32:
                tiles = cute.make_rmem_tensor((SCAN_PER_LANE,), Int32)
                run = Int32(0)
                for j in cutlass.range_constexpr(SCAN_PER_LANE):
                    g = tidx * SCAN_PER_LANE + j
                    tiles[j] = Int32(0)
                    if g < n_groups:
                        tiles[j] = (cutlass.min(mGroup[g], mg) + c.bm - 1) // c.bm
                    run = run + tiles[j]
                before = warp_inclusive_scan(run, tidx) - run
                for j in cutlass.range_constexpr(SCAN_PER_LANE):
                    g = tidx * SCAN_PER_LANE + j
                    if g < n_groups:
                        gt[g] = tiles[j]
                        gf[g] = before
                    before = before + tiles[j]
            cute.arch.barrier()
            return gf[n_groups - 1] + gt[n_groups - 1]
        lo, hi = Int32(0), tiles_m
        for _ in cutlass.range(32, unroll=1):
            if lo < hi:
                mid = (lo + hi) // 2
                if mGroup[mid * c.bm] >= 0:
                    lo = mid + 1
                else:
                    hi = mid
        return lo

    @cute.jit
    def _unit(self, u, tiles_n, n_groups, mg, mGroup, st):
        """Unit u of the compact list -> (group, m tile, n tile, expert, rows of the group that are real)."""
        nt = u % tiles_n
        t = u // tiles_n
        g = Int32(0)
        mt = t
        e = Int32(0)
        limit = mg
        if cutlass.const_expr(self.cfg.layout == "masked"):
            gf = st.gfirst.get_tensor(cute.make_layout((MAX_GROUPS,)))
            lo = last_group(gf, n_groups, t)  # the last group whose first tile is <= t: the one holding t
            g = lo
            e = lo
            mt = t - gf[lo]
            limit = cutlass.min(mGroup[lo], mg)
        else:
            e = mGroup[t * self.cfg.bm]
        return g, mt, nt, e, limit

    @cute.jit
    def _item(self, w, plan, n_kb):
        """Work item w -> (unit, first K block, the block past its last, workspace slot): a whole unit, or (split_k)
        a tail slice (grouped_slices.item_range)."""
        u, kb0, kb1, slot = w, Int32(0), n_kb, Int32(0)
        if cutlass.const_expr(self.cfg.split_k > 1):
            u, kb0, kb1, slot = item_range(w, plan[0], plan[1], n_kb)
        return u, kb0, kb1, slot

    @cute.jit
    def _holds_sum(self, accs, split, st, bar, w, slot, ctid):
        """split_k: whether this CTA now holds item w's whole unit sum in `accs`: a whole unit does; a tail unit's
        slice adds its partial into the unit's workspace tile and only the last one in does, with the sum
        (kernels/split_merge.add_and_count; CTA-uniform, so the epilogue's barriers see every consumer thread)."""
        c = self.cfg
        mWork, mCount, full, slices = split
        done = cutlass.Boolean(True)
        if w >= full:
            done = add_and_count(accs, mWork, mCount, st.flag.get_tensor(cute.make_layout((4,))), bar, slot,
                                 slot * (c.bn * c.bm) + ctid, 128 * c.n_mma_wg, slices, ctid)
        return done
