"""FP8 e4m3 quant-dequant of a 64-wide block held by 16 consecutive lanes (spec §2.3, `act_quant`
with ue8m0 scales): amax = max(|x|, 1e-4); s = 2^ceil(log2(amax·fp32(1/448))) from the IEEE bits;
x' = e4m3_RNE(clamp(x/s, ±448))·s. Device helpers, called from a kernel at trace time."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4
LANES_PER_BLOCK = 16  # 64 values, 4 per lane


def pow2_ceil(x: Float32) -> Float32:
    """2^ceil(log2(x)) for a positive normal fp32 x, from its bits (as the oracle's `pow2_ceil`)."""
    f = cute.make_rmem_tensor((1,), Float32)
    f[0] = x
    bits = cute.recast_tensor(f, Int32)
    b = bits[0]
    exponent = (b >> 23) & 0xFF
    exponent = exponent + ((b & 0x7FFFFF) != 0).to(Int32)
    bits[0] = exponent << 23
    return f[0]


def qdq_block(vals, n: int) -> None:
    """In place on the lane's n fp32 values; the 16 lanes of an aligned half-warp form one block.

    Every lane of the warp must call this (the amax is a full-warp xor butterfly within 16 lanes).
    """
    amax = Float32(0.0)
    for i in range(n):
        amax = cute.arch.fmax(amax, cute.math.absf(vals[i]))
    for offset in (8, 4, 2, 1):
        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
    scale = pow2_ceil(cute.arch.fmax(amax, Float32(AMAX_FLOOR)) * Float32(1.0 / E4M3_MAX))
    scaled = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        scaled[i] = cute.arch.fmax(cute.arch.fmin(vals[i] / scale, Float32(E4M3_MAX)), Float32(-E4M3_MAX))
    codes = scaled.load().to(cutlass.Float8E4M3FN).to(Float32)
    scaled.store(codes)
    for i in range(n):
        vals[i] = scaled[i] * scale
