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


def cute_abs(v: Float32) -> Float32:
    return bits_f32(f32_bits(v) & 0x7FFFFFFF)


def cute_fmin(a: Float32, b: Float32) -> Float32:
    return cutlass.cute.arch.fmin(a, b)


@dsl_user_op
def lop3(a, b, c, lut: int, *, loc=None, ip=None) -> Int32:
    """`lop3.b32 d, a, b, c, lut`: any bitwise function of three words in one instruction (the truth
    table over a = 0xF0, b = 0xCC, c = 0xAA); for the cases ptxas does not fold into one LOP3."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)], f"lop3.b32 $0, $1, $2, $3, {lut:#x};",
        "=r,r,r,r", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
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


# ---------------------------------------------------------------- packed e2m1 on bf16 pairs (the rotate path)
def _i32(v: int) -> int:
    """A 32-bit pattern as the signed Python int an Int32 constant takes."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


BF16X2_ABS = 0x7FFF7FFF
BF16X2_ONE = 0x3F803F80
BF16X2_TWO = 0x40004000
BF16X2_64 = 0x42804280  # 64 + m for m in [0, 1]: bf16 ulp 0.5 on [64, 128), so the sum rounds m to 0.5 steps (RNE)
BF16X2_MINUS_126 = _i32(0xC2FCC2FC)  # 2(64 + c/2) - 126 = 2 + c, whose bits are (c + 256) · 64
BF16X2_260 = 0x43824382  # 65 · 4: Veltkamp's split constant 2^(8-2) + 1, times the x4 that aligns the nibble
BF16X2_MINUS_4 = _i32(0xC080C080)
SIGN_AND_DOMAIN = 0x42004200  # per lane: nibble bit 3 (bit 9), and bit 14, set in every code of the split's domain
LUT_SIGN_INTO_CODE = (0xCC & 0xAA & ~0xF0 | ~0xCC & 0xF0) & 0xFF  # lop3(code, k, s): k ? s & ~code : code
NIBBLE_MAGNITUDES = 0x77777777  # bits 0-2 of each of 8 packed nibbles


def bf16x2_pow2(e: Int32) -> Int32:
    """Both lanes of a bf16x2 = 2^(127 - e), the inverse of a ue8m0 scale (exact for 1 <= e <= 253)."""
    return ((2 * UE8M0_BIAS - e) << 7) * 0x10001


def e2m1x2_nibbles(p: Int32, inv: Int32) -> Int32:
    """Two e2m1 codes from a bf16x2 `p` and the block's bf16x2 inverse scale `inv`, bit-exact with
    oracles.quant.e2m1_encode(lane · scale⁻¹) up to the sign of zero codes (pack_codes clears it);
    lane k's code nibble is at bits 16k + 6..9.

    a = |p| · inv is exact (a power of two) and a <= 6 for every bf16 block max (the ue8m0 rule;
    checked over all bf16 in the tests), so no saturation is needed:
    - up to 1 the grid is the multiples of 0.5: L = bf16(min(a, 1) + 64) = 64 + RNE(2a)/2 (bf16 ulp
      0.5 on [64, 128), ties to the even code), and 2L − 126 = 2 + c, whose bf16 bits are (c + 256)·64;
    - from 1 on the grid is bf16 with one mantissa bit: Veltkamp's split g = 260a, d = g − 4a,
      r = g − d rounds 4a to 2 significant bits with ties to even, and its bits are (code + 256)·64;
    - at 1 both give code 2; below 1 the split's code is the smaller, above 1 the clamped path's (it
      stops at code 2), so one u16x2 max of the two is the code. All of it but the clamp, the max
      and the sign runs on the bf16x2 pipe, off the integer ALU the rest of the kernel crowds.
    The sign goes to nibble bit 3 of every code, zero included; no other bit is set.
    """
    a = packed("mul.rn.bf16x2", p & BF16X2_ABS, inv)
    half_steps = packed("add.rn.bf16x2", packed("min.u16x2", a, BF16X2_ONE), BF16X2_64)
    lo = packed("fma.rn.bf16x2", half_steps, BF16X2_TWO, BF16X2_MINUS_126)
    g = packed("mul.rn.bf16x2", a, BF16X2_260)
    r = packed("sub.rn.bf16x2", g, packed("fma.rn.bf16x2", a, BF16X2_MINUS_4, g))
    code = packed("max.u16x2", r, lo)  # per lane 0x4000 | code << 6
    # k ? (s & ~code) : code with k = SIGN_AND_DOMAIN: the sign into bit 9, the domain's bit 14 out
    return lop3(code, SIGN_AND_DOMAIN, p >> 6, LUT_SIGN_INTO_CODE)


def pack_codes(n0: Int32, n1: Int32, n2: Int32, n3: Int32) -> Int32:
    """8 codes as 4 bytes, element 2k in the low nibble of byte k, from the e2m1x2_nibbles of the
    pairs (0, 4), (1, 5), (2, 6), (3, 7): n0 + (n1 << 4) holds elements 0, 1 at bits 6-13 and 4, 5
    at 22-29, n2 + (n3 << 4) elements 2, 3 and 6, 7, so one shift each way interleaves the bytes."""
    return clear_negative_zeros(((n0 + (n1 << 4)) >> 6) + ((n2 + (n3 << 4)) << 2))


def clear_negative_zeros(word: Int32) -> Int32:
    """8 packed e2m1 codes with the sign on every nibble -> −0 (0b1000) becomes +0 (the oracle's
    rule: negative only for codes >= 1). Per nibble, magnitude + 7 carries into bit 3 exactly when
    the magnitude is >= 1 (and never out of the nibble), so bit 3 of that sum keeps the sign; one
    fix per word of 8 codes where fixing each pair would cost 2 instructions per pair."""
    return word & (((word & NIBBLE_MAGNITUDES) + NIBBLE_MAGNITUDES) | NIBBLE_MAGNITUDES)
