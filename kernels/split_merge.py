"""Split-K fix-up through a global fp32 workspace, shared by the FP8 GEMM (kernels/gemm/persistent_sm90.py) and v5 of the
grouped expert GEMM (kernels/moe/grouped_rs.py, its tail split: kernels/moe/grouped_slices.py): every slice of a tile
adds its partial into the tile's zeroed workspace with red.global.add (fire and forget) and counts itself in; the last
slice to arrive reads the sum back, zeroes the workspace and the counter for the next call, and stores the tile. No
slice ever waits for another, so the slices need not be resident together. Addition order varies run to run."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def add_and_count(values: list, mWork, mCount, flag, bar, t, base, stride, slices, tid, holds=True) -> cutlass.Boolean:
    """`values` (register tensors, element i of their concatenation at mWork[base + i * stride]; workspace layout
    [tile][element][thread]: coalesced) added into tile t's workspace; True on the last of `slices` slices to arrive,
    whose `values` then hold the tile's sum. `bar`: a barrier over the threads holding the tile, `flag` one shared
    word, `tid` 0 counts; `holds`: whether this thread holds values (the others only take part in the barriers)."""
    if holds:
        i = 0
        for v in values:
            for j in cutlass.range_constexpr(cute.size(v)):
                cute.arch.red(mWork.iterator + (base + i * stride), v[j], op="add", dtype=cutlass.Float32,
                              sem="relaxed", scope="gpu")
                i += 1
    cute.arch.fence_acq_rel_gpu()
    bar.arrive_and_wait()
    if tid == 0:
        old = cute.arch.atomic_add(mCount.iterator + t, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        is_last = old == slices - 1
        flag[0] = cutlass.Int32(1) if is_last else cutlass.Int32(0)
        if is_last:
            mCount[t] = cutlass.Int32(0)
    bar.arrive_and_wait()
    last = flag[0] != 0
    if last and holds:
        cute.arch.fence_acq_rel_gpu()
        i = 0
        for v in values:
            for j in cutlass.range_constexpr(cute.size(v)):
                v[j] = mWork[base + i * stride]
                i += 1
        i = 0
        for v in values:
            for j in cutlass.range_constexpr(cute.size(v)):
                mWork[base + i * stride] = cutlass.Float32(0.0)
                i += 1
    bar.arrive_and_wait()
    return last
