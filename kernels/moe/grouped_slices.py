"""The tail round of v5's units split in K (GroupedConfig.split_k > 1): a stream-K-like balance for decode steps.

v5 deals its units (256 weight rows x a token tile) over the CTAs round-robin. When the count is not a multiple of
the grid, the last round runs a few units on a few CTAs while the rest idle: Pro T = 1's L1 is 6 experts x 24 n
tiles = 144 units, 132 + 12 (2 x 56 K blocks where 61 would balance). Here the units of the full rounds run whole
and each tail unit runs as `s` K slices (as many as the grid holds, up to split_k), so the tail takes ~n_kb / s
blocks plus one fix-up: each slice adds its fp32 partial into the unit's workspace tile and the last to arrive runs
the epilogue (kernels/split_merge.add_and_count). The plan is made on the device from the unit count the work list
gives; the rule launches this build only where the host's bound on that count says it cuts (`tail_slices`). Every
unit split (d5d2260) lost: a fix-up costs ~5 us an item (lesson 20); past one full round the CTAs drift apart and
the stream stays DRAM-bound through the tail (lesson 21)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

SPLIT_FIX_KB = 8  # a fix-up (partial adds, fence, counter; the last slice's read-back) in a CTA's K blocks: ~5 us


def _slices_pay(c, tail, gdim, n_kb):
    """c slices of each of `tail` units fit the grid at once and their blocks plus a fix-up beat a whole unit (host ints
    or device Int32s alike)."""
    return (c * tail <= gdim) & (n_kb >= c) & ((n_kb + c - 1) // c + SPLIT_FIX_KB < n_kb)


def tail_slices(units: int, gdim: int, n_kb: int, max_split: int) -> int:
    """`split_plan`'s rule on the host: the slices of each tail unit (1: no split). The rule's layer calls it on a
    bound of the units (CompiledLayer.gemms) and launches the split build only where it would split."""
    tail = units % gdim
    if not (tail > 0 and units < 2 * gdim):  # a part round after at most one full one
        return 1
    return max((c for c in range(2, max_split + 1) if _slices_pay(c, tail, gdim, n_kb)), default=1)


@cute.jit
def split_plan(units, gdim, n_kb, cap, max_split: cutlass.Constexpr):
    """(units run whole, slices of each tail unit): with at most one full round, the tail (units % gdim) split into the
    most slices s <= max_split the grid holds at once (s x tail <= gdim) where its blocks plus a fix-up beat a whole
    unit (`_slices_pay`, shared with the host's `tail_slices`); else (units, 1)."""
    tail = units % gdim
    s = Int32(1)
    if (tail > 0) & (tail <= cap) & (units < 2 * gdim):
        for c in cutlass.range_constexpr(2, max_split + 1):
            if _slices_pay(c, tail, gdim, n_kb):
                s = Int32(c)
    full = units
    if s > 1:
        full = units - tail
    return full, s


@cute.jit
def item_range(w, full, slices, n_kb):
    """Item w -> (unit, its first K block, the block past its last, its workspace slot): items below `full` are whole
    units, the rest `slices` slices of the tail unit full + (w - full) // slices (slot: its index in the tail)."""
    u, kb0, kb1, slot = w, Int32(0), n_kb, Int32(0)
    if w >= full:
        t = w - full
        slot = t // slices
        r = t - slot * slices
        u = full + slot
        kb0 = r * n_kb // slices
        kb1 = (r + 1) * n_kb // slices
    return u, kb0, kb1, slot
