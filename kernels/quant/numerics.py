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
def packed(op: str, *args, loc=None, ip=None) -> Int32:
    """One PTX instruction `op d, a, b[, c]` on 32-bit registers holding two 16-bit lanes, such as
    `mul.rn.bf16x2`, `add.rn.bf16x2`, `fma.rn.bf16x2` (sm_90: bf16x2 add/mul) or `max.u16x2` (sm_90)."""
    operands = ", ".join(f"${i + 1}" for i in range(len(args)))
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip) for a in args], f"{op} $0, {operands};",
        "=r," + ",".join("r" * len(args)),
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def ffma(a, b, c, *, loc=None, ip=None) -> Float32:
    """`fma.rn.f32`: one rounding of a·b + c (with b = ±1, exactly the rounded a + c or c − a)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)], "fma.rn.f32 $0, $1, $2, $3;",
        "=f,f,f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
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


# ---------------------------------------------------------------- packed e2m1 on bf16 pairs (v3)
def _i32(v: int) -> int:
    """A 32-bit pattern as the signed Python int an Int32 constant takes."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


BF16X2_ABS = 0x7FFF7FFF
BF16X2_TWO = 0x40004000
BF16X2_96 = 0x42C042C0  # 96 + m for m in [0, 2]: bf16 ulp 0.5 on [64, 128), so the sum rounds m to 0.5 steps (RNE)
BF16X2_260 = 0x43824382  # 65 · 4: Veltkamp's split constant 2^(8-2) + 1, times the x4 that aligns the nibble
BF16X2_MINUS_4 = _i32(0xC080C080)
NIBBLE_SIGN = 0x02000200  # each lane's nibble bit 3 (bit 9 of the lane)
NIBBLE_NONZERO = 0x01C001C0  # + 7 << 6: carries into bit 9 exactly when the code is >= 1
# L = 0x42C0 + c per lane -> (c + 256) · 64 = c << 6 | 0x4000, the domain of the split's bf16 bits
LO_TO_NIBBLE = _i32((0x4000 - 0x42C0 * 64) * 0x10001)


def bf16x2_pow2(e: Int32) -> Int32:
    """Both lanes of a bf16x2 = 2^(127 - e), the inverse of a ue8m0 scale (exact for 1 <= e <= 253)."""
    return ((2 * UE8M0_BIAS - e) << 7) * 0x10001


def e2m1x2_nibbles(p: Int32, inv: Int32) -> Int32:
    """Two e2m1 codes from a bf16x2 `p` and the block's bf16x2 inverse scale `inv`, bit-exact with
    oracles.quant.e2m1_encode(lane · scale⁻¹); lane k's code nibble is at bits 16k + 6..9.

    a = |p| · inv is exact (a power of two) and a <= 6 for every bf16 block max (the ue8m0 rule;
    checked over all bf16 in the tests), so no saturation is needed:
    - below 2 the grid is the multiples of 0.5: L = bf16(min(a, 2) + 96) = 0x42C0 + RNE(2a) (bf16
      ulp 0.5 on [64, 128), ties to the even code);
    - from 1 on the grid is bf16 with one mantissa bit: Veltkamp's split g = 260a, d = g − 4a,
      r = g − d rounds 4a to 2 significant bits with ties to even, and its bits are (code + 256)·64;
    - on [1, 2) both agree; below 1 the split's code is the smaller, at or above 2 the magic's (it
      saturates at code 4), so one u16x2 max of the two, in the split's domain, is the code.
    The sign goes to nibble bit 3 only for codes >= 1 (−0 and |v| <= 0.25 give +0).
    """
    a = packed("mul.rn.bf16x2", p & BF16X2_ABS, inv)
    lo = packed("add.rn.bf16x2", packed("min.u16x2", a, BF16X2_TWO), BF16X2_96) * 64 + LO_TO_NIBBLE
    g = packed("mul.rn.bf16x2", a, BF16X2_260)
    r = packed("sub.rn.bf16x2", g, packed("fma.rn.bf16x2", a, BF16X2_MINUS_4, g))
    code = packed("max.u16x2", r, lo)
    return code | ((p >> 6) & NIBBLE_SIGN & (code + NIBBLE_NONZERO))
