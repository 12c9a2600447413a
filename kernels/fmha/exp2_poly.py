"""exp2 on the FMA pipe: 2^x = 2^j · 2^f with j = rne(x), f = x − j in [−0.5, 0.5] and 2^f a
degree-3 polynomial (relative error < 7.5e-5, below bf16's 3.9e-3 step). The softmax's exp2 runs
on the MUFU (16 per clock per SM on SM90); moving some columns of a score tile onto the FMA pipe
(~10 instructions each) takes load off it (FA4's trick, written here for this kernel).

x ≤ 0 here (scores minus the row max) or −inf (masked): x is clamped at −128, where the exponent
arithmetic underflows to a negative integer, and max(bits, 0) turns that into an exact +0.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernels.quant.numerics import bits_f32, f32_bits

ROUND_MAGIC = 12582912.0  # 1.5 · 2^23: x + this rounds x to an integer held in the low mantissa bits
POLY = (0.99992811, 0.69326099, 0.24261054, 0.05517132)  # 2^f on [-0.5, 0.5], relative minimax


def exp2_fma(x):
    x = cute.arch.fmax(x, Float32(-128.0))
    t = x + Float32(ROUND_MAGIC)
    f = x - (t - Float32(ROUND_MAGIC))
    p = Float32(POLY[3])
    for c in (POLY[2], POLY[1], POLY[0]):
        p = p * f + Float32(c)
    bits = f32_bits(p) + (f32_bits(t) << 23)  # the low bits of t hold j; 0x4B40_0000 << 23 wraps to 0
    return bits_f32(cutlass.max(bits, Int32(0)))
