"""K slices of v5's units (GroupedConfig.split_k > 1), for decode steps with few units.

One token routes to 6 experts: Flash's L1 is 6 x 16 units of 256 weight rows on 132 SMs (36 idle), Pro's 6 x 24 = 144
(12 CTAs run two units, every other CTA one: 2 x 56 K blocks where 61 would balance). A unit then runs as `slices`
items, item w = (unit w // slices, K blocks [r n_kb / slices, (r + 1) n_kb / slices) for r = w % slices), dealt over
the CTAs like units; each slice adds its fp32 partial into the unit's workspace tile and the last to arrive runs the
epilogue (kernels/split_merge.add_and_count). The number of slices is chosen on the device, from the unit count
the work list gives (the host does not know which experts hold rows): the s in 1 .. split_k whose rounds x (K blocks
a slice + SPLIT_FIX_KB) is smallest, 1 on ties, so steps with many units never split."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

SPLIT_FIX_KB = 2  # a slice's fix-up (partial adds, fence, counter; the last slice's read-back) in a CTA's K blocks


@cute.jit
def slices_for(units, gdim, n_kb, cap, max_split: cutlass.Constexpr):
    """The slices a unit runs as (1 .. max_split; 1 where units > cap, the workspace's tiles, or n_kb < s)."""
    best = (units + gdim - 1) // gdim * n_kb
    s = Int32(1)
    if units <= cap:
        for c in cutlass.range_constexpr(2, max_split + 1):
            cost = (units * c + gdim - 1) // gdim * ((n_kb + c - 1) // c + SPLIT_FIX_KB)
            if (cost < best) & (n_kb >= c):
                best = cost
                s = Int32(c)
    return s


@cute.jit
def item_range(w, slices, n_kb):
    """Item w -> (unit, its first K block, the block past its last)."""
    u = w // slices
    r = w - u * slices
    return u, r * n_kb // slices, (r + 1) * n_kb // slices
