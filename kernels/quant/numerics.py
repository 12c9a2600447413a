"""Bit-level helpers for the quantisation kernels: ue8m0 scales, bf16/e4m3/e2m1 rounding.

Everything is plain integer/float arithmetic or one PTX `cvt` that exists on sm_89 and later, so a
kernel built from these compiles unchanged for sm_90a and sm_100a. The scale and rounding rules are
those of oracles/quant.py (spec §2.3, §2.4): the kernels must reproduce them bit for bit.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass._mlir.dialects import math as mlir_math
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.bits import bits_f32, f32_bits

UE8M0_BIAS = 127


@dsl_user_op
def e4m3x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two fp32 → two e4m3fn codes (RNE, saturating at ±448): `lo` in bits 0-7, `hi` in bits 8-15."""
    return Int32(llvm.inline_asm(
        T.i32(),
        [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b16 t;\ncvt.rn.satfinite.e4m3x2.f32 t, $1, $2;\ncvt.u32.u16 $0, t;\n}",
        "=r,f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def ue8m0_exponent(amax: Float32, inv_qmax: float) -> Int32:
    """Biased exponent e of the scale 2^ceil(log2(amax·fp32(1/qmax))) (`fast_round_scale`); amax is floored."""
    bits = f32_bits(amax * Float32(inv_qmax))
    e = (bits >> 23) & 0xFF
    return e + Int32((bits & 0x7FFFFF) != 0)


def inv_pow2(e: Int32) -> Float32:
    """1 / 2^(e - 127) as an exact fp32 (valid for 1 <= e <= 253)."""
    return bits_f32((2 * UE8M0_BIAS - e) << 23)


@dsl_user_op
def bf16x2_bits(lo, hi, *, loc=None, ip=None) -> Int32:
    """`cvt.rn.bf16x2.f32`: RNE of two fp32 to bf16 (one instruction), `lo` in bits 0-15, `hi` in 16-31."""
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def round_bf16x2(lo: Float32, hi: Float32):
    """RNE of two finite fp32 to bf16, returned as fp32: one cvt and two unpacks (bf16 → fp32 is a 16-bit shift)."""
    bits = bf16x2_bits(lo, hi)
    return bits_f32(bits << 16), bits_f32(bits & -65536)


def cute_abs(v: Float32) -> Float32:
    return bits_f32(f32_bits(v) & 0x7FFFFFFF)


def cute_fmin(a: Float32, b: Float32) -> Float32:
    return cutlass.cute.arch.fmin(a, b)


@dsl_user_op
def prmt(a, b, selector: int, *, loc=None, ip=None) -> Int32:
    """`prmt.b32 d, a, b, selector`: byte k of d is byte (selector >> 4k) & 7 of the pair b:a."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
        f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def fabs(x, *, loc=None, ip=None) -> Float32:
    """|x| as `abs.f32`: ptxas folds it into the consumer's |.| operand modifier (FMNMX, FADD, ...)."""
    return Float32(mlir_math.absf(Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


# ---------------------------------------------------------------- branch-free e2m1 (v2)
E2M1_MAGIC = 1.5 * 2.0**22  # fp32 ulp 0.5 on [2^22, 2^23): a + M rounds a to a multiple of 0.5, RNE
E2M1_MAGIC_BITS = 0x4AC00000


def e2m1_code(v: Float32) -> Int32:
    """RNE of a scaled fp32 (|v| saturates at 6) to an e2m1 code 0..15 (bit 3 the sign, −0 → +0), without
    threshold compares; bit-exact with oracles.quant.e2m1_encode for every fp32.

    a = min(|v|, 6). Below 2 the e2m1 grid is the multiples of 0.5, so the code is RNE(2a), the low
    bits of a + 1.5·2^22 (fp32 ulp 0.5 there). From 2 on the grid is fp32 with one mantissa bit:
    round a's bits to bit 22 with ties to even, b + 0x1FFFFF + bit22, and read (b >> 22) - 252
    (2.0 = 0x40000000 → 4, 3 → 5, 4 → 6, 6 → 7). Sign in bit 3 only for codes > 0: v < -0.25.
    """
    a = cute_fmin(fabs(v), Float32(6.0))
    lo = f32_bits(a + Float32(E2M1_MAGIC)) - E2M1_MAGIC_BITS
    b = f32_bits(a)
    hi = ((b + 0x1FFFFF + ((b >> 22) & 1)) >> 22) - 252
    code = cutlass.select_(a < Float32(2.0), lo, hi)
    return cutlass.select_(v < Float32(-0.25), code | 8, code)
