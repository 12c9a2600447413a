"""MXFP4 quantisation: the branch-free fp32 e2m1 rounding (kernels/quant/numerics.e2m1_code, the
unrotated path) and the Hadamard-128 + MXFP4 rotate path, v4 (kernels/quant/rotate.py: two lanes per
row, loads staged through shared memory, e2m1 on bf16 pairs).

CPU: a numpy emulation of the exact integer/float steps of `e2m1_code` against
oracles.quant.e2m1_encode over every fp32 within 65,536 ulps of each rounding boundary and a strided
sweep of all |x| <= 8 (both signs, ±0, subnormals, 6, >6), plus values above 8 (the full |x| <= 8
sweep, 2.2e9 patterns, passed once at 5497c38 and took 2 min 40 s). The packed bf16x2 e2m1
(`e2m1x2_nibbles` + `pack_codes`) over every bf16 of both signs and every scale exponent; the ue8m0
rule's bound (scaled block max <= 6) over every bf16; the lane choreography emulated step by step against the
reference butterfly order and the oracle; the kernel compiles for sm_90a / sm_100a without local memory.
GPU (`-m gpu`, skipped without CUDA): the rotate path bit-exact (codes and scales) at 262,144 rows, at
ragged row counts, with a row stride, and on rows of bf16 subnormals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.quant.numerics import E2M1_MAGIC, E2M1_MAGIC_BITS
from oracles.quant import e2m1_encode

F32_8 = 0x41000000  # bits of 8.0


def e2m1_emulated(v: np.ndarray) -> np.ndarray:
    """The same steps as numerics.e2m1_code, in numpy fp32 / int32 (fp32 adds round to nearest even)."""
    v = v.astype(np.float32, copy=False)
    a = np.minimum(np.abs(v), np.float32(6.0))
    lo = (a + np.float32(E2M1_MAGIC)).view(np.int32) - np.int32(E2M1_MAGIC_BITS)
    b = a.view(np.int32)
    hi = ((b + np.int32(0x1FFFFF) + ((b >> 22) & 1)) >> 22) - 252
    code = np.where(a < np.float32(2.0), lo, hi)
    return np.where(v < np.float32(-0.25), code | 8, code).astype(np.uint8)


def test_magic_constant():
    assert np.float32(E2M1_MAGIC).view(np.int32) == E2M1_MAGIC_BITS
    assert np.spacing(np.float32(E2M1_MAGIC)) == 0.5 and np.spacing(np.float32(E2M1_MAGIC + 6)) == 0.5


MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0)  # every rounding boundary, and saturation
WINDOW = 1 << 16  # fp32 patterns on each side of a boundary, all of them


@pytest.mark.parametrize("sign", [0, 1])
def test_e2m1_exhaustive_near_every_boundary_and_strided_elsewhere(sign):
    """Every fp32 within 65,536 ulps of each rounding midpoint (and of 0 and 6), plus every 61st bit
    pattern with |x| <= 8 (subnormals included), against the oracle."""
    centres = np.array((0.0,) + MIDPOINTS, dtype=np.float32).view(np.int32).astype(np.int64)
    near = (centres[:, None] + np.arange(-WINDOW, WINDOW + 1)[None, :]).ravel()
    strided = np.arange(0, F32_8 + 1, 61, dtype=np.int64)
    bits = np.concatenate([near, strided])  # overlaps are harmless; np.unique here cost ~25 s
    bits = bits[(bits >= 0) & (bits <= F32_8)]
    v = (bits | (sign << 31)).astype(np.uint32).view(np.int32).view(np.float32)
    got = e2m1_emulated(v)
    want = e2m1_encode(torch.from_numpy(v)).numpy()
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{bad.size} mismatches, first x={v[bad[0]]!r} got {got[bad[0]]} want {want[bad[0]]}"


def test_e2m1_edges():
    """The named edge cases, ±inf, and values above 8 up to the fp32 max (saturation at code 7)."""
    v = np.array([0.0, -0.0, 1e-45, -1e-45, 0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0,
                  6.5, -7.0, 8.0, 1e10, -3.4e38, np.inf, -np.inf], dtype=np.float32)
    big = np.arange(F32_8, 0x7F800000, 9973, dtype=np.int64).astype(np.int32).view(np.float32)
    for x in (v, big, -big):
        assert (e2m1_emulated(x) == e2m1_encode(torch.from_numpy(x)).numpy()).all()
    assert e2m1_emulated(np.array([-0.0, -0.25], np.float32)).tolist() == [0, 0]


# ---------------------------------------------------------------- e2m1 on bf16 pairs, emulated

def _bf16(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (RNE), as fp32."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def _halves(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, dtype=np.int64) & 0xFFFFFFFF
    return w & 0xFFFF, w >> 16


def _join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)


def _as_f32(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.int64) << 16).astype(np.uint32).view(np.float32)


def _to_bits(v: np.ndarray) -> np.ndarray:
    return (_bf16(v).view(np.uint32) >> 16).astype(np.int64)


def _bf16x2(fn):
    """A bf16x2 instruction on packed words: fn on each lane's fp32 value, one RNE rounding to bf16
    (fp32 holds every exact result the kernel's operands produce, so no double rounding)."""
    def op(*ws):
        lanes = [_halves(w) for w in ws]
        return _join(*(_to_bits(fn(*(_as_f32(l[k]) for l in lanes))) for k in (0, 1)))
    return op


def _u16x2(fn):
    def op(a, b):
        (a0, a1), (b0, b1) = _halves(a), _halves(b)
        return _join(fn(a0, b0), fn(a1, b1))
    return op


_EMU = {
    "mul.rn.bf16x2": _bf16x2(lambda a, b: a * b),
    "add.rn.bf16x2": _bf16x2(lambda a, b: a + b),
    "sub.rn.bf16x2": _bf16x2(lambda a, b: a - b),
    "fma.rn.bf16x2": _bf16x2(lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float32)),
    "min.u16x2": _u16x2(np.minimum),
    "max.u16x2": _u16x2(np.maximum),
}


def e2m1x2_emulated(p: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """numerics.e2m1x2_nibbles step by step on int64 words (32-bit wrap-around where the kernel wraps)."""
    from kernels.quant import numerics as nm

    def packed(op, *args):
        return _EMU[op](*args)

    m32 = 0xFFFFFFFF
    a = packed("mul.rn.bf16x2", p & nm.BF16X2_ABS, inv)
    half_steps = packed("add.rn.bf16x2", packed("min.u16x2", a, nm.BF16X2_ONE), nm.BF16X2_64)
    lo = packed("fma.rn.bf16x2", half_steps, nm.BF16X2_TWO, nm.BF16X2_MINUS_126 & m32)
    g = packed("mul.rn.bf16x2", a, nm.BF16X2_260)
    r = packed("sub.rn.bf16x2", g, packed("fma.rn.bf16x2", a, nm.BF16X2_MINUS_4 & m32, g))
    code = packed("max.u16x2", r, lo)
    return _lop3(code, nm.SIGN_AND_DOMAIN, (p & m32) >> 6, nm.LUT_SIGN_INTO_CODE)


def _lop3(a, b, c, lut: int):
    """PTX lop3.b32 from its truth table: bit (a << 2 | b << 1 | c) of lut, per bit position."""
    m32 = 0xFFFFFFFF
    a, b, c = (np.asarray(v, dtype=np.int64) & m32 for v in (a, b, c))
    out = np.zeros(np.broadcast(a, b, c).shape, np.int64)
    for i in range(8):
        if lut >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c) & m32
    return out


def pack_codes_emulated(n0, n1, n2, n3):
    """numerics.pack_codes on int64 words (32-bit wrap-around where the kernel wraps)."""
    from kernels.quant import numerics as nm
    m32 = 0xFFFFFFFF
    w = ((((n0 + (n1 << 4)) & m32) >> 6) + (((n2 + (n3 << 4)) << 2) & m32)) & m32
    return w & ((((w & nm.NIBBLE_MAGNITUDES) + nm.NIBBLE_MAGNITUDES) & m32) | nm.NIBBLE_MAGNITUDES)


def test_scaled_block_max_never_exceeds_6():
    """The ue8m0 rule keeps every scaled bf16 block max <= 6 (so the kernel needs no saturation) and
    its exponent in [1, 253] (so 2^(127 - e) is a normal bf16), for every finite bf16 max."""
    amax = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    q = (torch.maximum(amax, torch.tensor(6.0 * 2.0**-126)) * torch.tensor(1 / 6.0)).view(torch.int32)
    e = ((q >> 23) & 0xFF) + ((q & 0x7FFFFF) != 0).int()
    assert 1 <= int(e.min()) and int(e.max()) <= 253
    assert float((amax * ((254 - e) << 23).view(torch.float32)).max()) == 6.0


def test_e2m1x2_every_bf16_and_every_scale():
    """Every bf16 of both signs whose scaled magnitude is <= 6 (subnormals, ±0 included), in both lanes,
    at every scale exponent that can hold it, against oracles.quant.e2m1_encode of the exact quotient."""
    from kernels.quant.numerics import bf16x2_pow2

    every = np.arange(0, 0x10000, dtype=np.int64)
    every = every[(every & 0x7F80) != 0x7F80]  # finite
    val = _as_f32(every)
    bad = stray = 0
    for e in range(1, 254):
        inv_f = np.float32(2.0 ** (127 - e))
        ok = np.abs(val.astype(np.float64)) * float(inv_f) <= 6.0
        lanes = every[ok]
        if lanes.size == 0:
            continue
        partner = np.roll(lanes, 1)  # a different value in the other lane
        inv = np.int64(bf16x2_pow2(e))  # plain integer arithmetic: the kernel's formula on a Python int
        n = e2m1x2_emulated(_join(lanes, partner), inv)
        stray += int((n & ~0x03C003C0).astype(bool).sum())  # nothing but the two nibbles (pack_codes adds words)
        packed = pack_codes_emulated(n, 0, 0, 0)  # elements 0 and 4
        n0, n1 = packed & 0xF, (packed >> 16) & 0xF
        want = e2m1_encode(torch.from_numpy((_as_f32(lanes).astype(np.float64) * float(inv_f)).astype(np.float32))).numpy()
        want_p = e2m1_encode(torch.from_numpy((_as_f32(partner).astype(np.float64) * float(inv_f)).astype(np.float32))).numpy()
        bad += int((n0 != want).sum() + (n1 != want_p).sum())
    assert bad == 0 and stray == 0


def _reference_order_rotation(rows: np.ndarray) -> np.ndarray:
    """fast_hadamard_transform's order: stages over element bits 0..6, (a + b, a − b) in fp32, then
    bf16(x · 128^-0.5)."""
    f = np.float32
    x = rows.astype(f).copy()
    for bit in range(7):
        h = 1 << bit
        i = np.array([s for s in range(128) if not s & h])
        a, b = x[:, i].copy(), x[:, i + h].copy()
        x[:, i], x[:, i + h] = a + b, a - b
    return _bf16((x * f(128 ** -0.5)).astype(f))


def rotate_emulated(rows: np.ndarray):
    """kernels/quant/rotate.py step by step: lanes, registers, shuffles, pair words, nibble packing,
    the word swap and the stores. rows [m, 128] of bf16 values → (codes [m, 64] uint8, scales [m, 4])."""
    from kernels.quant import rotate as rt
    from kernels.quant.numerics import BF16X2_ABS, bf16x2_pow2

    f = np.float32
    m = rows.shape[0]
    # x[row, lane, i], i = e + 8j holds element 8(lane + 2j) + e
    x = rows.astype(f).reshape(m, rt.VECS, rt.LANES, rt.VEC).transpose(0, 2, 1, 3).reshape(m, 2, 64).copy()

    def butterfly(h):
        i = np.array([s for s in range(64) if not s & h])
        a, b = x[:, :, i].copy(), x[:, :, i + h].copy()
        x[:, :, i], x[:, :, i + h] = a + b, a - b

    for h in (1, 2, 4):
        butterfly(h)
    other = x[:, ::-1, :].copy()  # shuffle xor 1
    sign = np.array([1, -1], f).reshape(1, 2, 1)
    x[:] = (x.astype(np.float64) * sign + other).astype(f)  # fma(x, ±1, other): one rounding
    for h in (8, 16, 32):
        butterfly(h)
    y = _bf16((x * f(rt.HADAMARD_N ** -0.5)).astype(f))
    bits = (y.view(np.uint32) >> 16).astype(np.int64)  # [row, lane, i]
    pairs = np.stack([_join(bits[..., 8 * j + e0], bits[..., 8 * j + e1])
                      for j in range(rt.VECS) for e0, e1 in rt.PAIRS], -1)  # [row, lane, 4j + p]
    words = np.zeros((m, 2, rt.VECS), np.int64)
    exps = np.zeros((m, 4), np.int64)
    for b in range(4):
        blk = pairs[..., 8 * b: 8 * b + 8] & BF16X2_ABS
        mx = np.maximum((blk & 0xFFFF).max(-1), (blk >> 16).max(-1)).max(-1)  # both lanes (the shuffle)
        amax = np.maximum(_as_f32(mx), f(rt.FP4_AMAX_FLOOR)).astype(f)
        q = (amax * f(1 / rt.FP4_MAX)).astype(f).view(np.int32).astype(np.int64)
        e = ((q >> 23) & 0xFF) + ((q & 0x7FFFFF) != 0)
        exps[:, b] = e
        inv = bf16x2_pow2(e)[:, None]
        for j in (2 * b, 2 * b + 1):
            words[..., j] = pack_codes_emulated(*[e2m1x2_emulated(pairs[..., 4 * j + p], inv) for p in range(4)])
    codes = np.zeros((m, 16), np.int64)  # 16 words of 4 bytes per row
    for lane in (0, 1):
        first, partner = lane == 0, 1 - lane
        for half in (0, 1):
            for k in (0, 1):
                mine, theirs = 4 * half + k, 4 * half + 2 + k
                got = words[:, partner, theirs] if partner == 0 else words[:, partner, mine]
                out0 = words[:, lane, mine] if first else got
                out1 = got if first else words[:, lane, theirs]
                base = 4 * (2 * half + lane)
                codes[:, base + 2 * k], codes[:, base + 2 * k + 1] = out0, out1
    scales = np.zeros((m, 4), np.int64)
    for lane in (0, 1):
        for k in (0, 1):
            scales[:, 2 * lane + k] = exps[:, k] if lane == 0 else exps[:, 2 + k]
    return codes.astype(np.uint32).view(np.uint8).reshape(m, 64), scales.astype(np.uint8)


def _oracle_codes(y_bf16_values: np.ndarray):
    from oracles.quant import mxfp4_quant, pack_fp4, ue8m0_encode
    codes, scale = mxfp4_quant(torch.from_numpy(y_bf16_values), 32)
    return pack_fp4(codes).numpy(), ue8m0_encode(scale).numpy()


@pytest.mark.parametrize("spread", [4, 40])
def test_rotate_emulated_matches_reference_order_and_oracle(spread):
    """The lane choreography gives the codes and scales of the reference butterfly order, also where the
    fp32 sums round (exponent spread 2^±40 inside a row), and the oracle's own (matmul rotation) where
    they are exact; rows of zeros and of bf16 subnormals included."""
    from oracles.hadamard import hadamard_rotate_lowprec
    gen = torch.Generator().manual_seed(spread)
    x = torch.randn(301, 128, generator=gen) * torch.exp2(torch.randint(-spread, spread + 1, (301, 128), generator=gen).float())
    x[3] = 0.0
    x[7] *= 2.0**-133  # bf16 subnormals after the rotation
    xb = x.to(torch.bfloat16).float().numpy()
    codes, scales = rotate_emulated(xb)
    want_codes, want_scales = _oracle_codes(_reference_order_rotation(xb))
    assert np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)
    if spread == 4:
        ref = hadamard_rotate_lowprec(torch.from_numpy(xb).to(torch.bfloat16)).float().numpy()
        oc, os_ = _oracle_codes(ref)
        assert np.array_equal(codes, oc) and np.array_equal(scales, os_)


def test_rotate_emulation_catches_a_swapped_pair():
    """The emulation is sensitive to the layout: pairing (0, 1) instead of (0, 4) must break it."""
    from kernels.quant import rotate as rt
    gen = torch.Generator().manual_seed(1)
    xb = torch.randn(64, 128, generator=gen).to(torch.bfloat16).float().numpy()
    want = _oracle_codes(_reference_order_rotation(xb))[0]
    saved = rt.PAIRS
    try:
        rt.PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))
        assert not np.array_equal(rotate_emulated(xb)[0], want)
    finally:
        rt.PAIRS = saved


# ---------------------------------------------------------------- compile (CPU) and GPU

def _fake_args():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    rows = cute.sym_int()
    x = make_fake_tensor(cutlass.BFloat16, (rows, 128), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    q = make_fake_compact_tensor(cutlass.Uint8, (rows, 64), stride_order=(1, 0), assumed_align=16)
    s = make_fake_compact_tensor(cutlass.Uint8, (rows, 4), stride_order=(1, 0), assumed_align=1)
    return x, q, s


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_rotate_compiles_without_local_memory(arch):
    import re

    from dsv4bench.compile.artifacts import artifact
    from dsv4bench.compile.ptxas import find_ptxas, run_ptxas
    from kernels.common import compile_kernel
    from kernels.quant.quant import QuantKernel

    compiled = compile_kernel(QuantKernel("mxfp4", 128, 32, True), *_fake_args(), arch=arch)
    exe, ptx = find_ptxas(), artifact(compiled, "__ptx__") if hasattr(compiled, "__ptx__") else None
    if exe is None or not ptx:
        pytest.skip("no ptxas / PTX not kept")
    assert b"kernel_rotate" in ptx
    rc, log = run_ptxas(exe, ptx, arch)
    assert rc == 0, log
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 80, log  # 7 CTAs of 128 threads per SM
    assert b"ld.local" not in ptx and b"st.local" not in ptx


def _run_gpu(m: int, stride: int = 128, tiny_rows: bool = False):
    from kernels.common import compile_kernel
    from kernels.quant.quant import QuantKernel
    from oracles.hadamard import hadamard_rotate_lowprec
    from oracles.quant import mxfp4_quant, pack_fp4, ue8m0_encode

    major, minor = torch.cuda.get_device_capability()
    compiled = compile_kernel(QuantKernel("mxfp4", 128, 32, True), *_fake_args(), arch=f"sm_{major}{minor}a")
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, stride, generator=gen) * torch.exp2(torch.empty(m, 1).uniform_(-10, 10, generator=gen))
    x = torch.where(torch.rand(m, stride, generator=gen) < 0.002, x * 40, x)
    if m >= 3:
        x[m // 2] = 0.0
    if tiny_rows:  # every other row's rotated values are bf16 subnormals (or just above)
        x[::2] *= torch.exp2(torch.empty(x[::2].shape[0], 1).uniform_(-140, -120, generator=gen))
    xb = x.to(torch.bfloat16)
    xd = xb.cuda()[:, :128]
    codes = torch.full((m + 1, 64), 0xA5, dtype=torch.uint8, device="cuda")
    scales = torch.full((m + 1, 4), 0xA5, dtype=torch.uint8, device="cuda")
    compiled(xd, codes[:m], scales[:m])
    torch.cuda.synchronize()
    ref_codes, ref_scale = mxfp4_quant(hadamard_rotate_lowprec(xb[:, :128]), 32)
    bad_rows = (codes[:m].cpu() != pack_fp4(ref_codes)).any(1).nonzero().flatten()
    assert bad_rows.numel() == 0, f"codes differ from the oracle in {bad_rows.numel()} rows, first {bad_rows[:5].tolist()}"
    assert torch.equal(scales[:m].cpu(), ue8m0_encode(ref_scale)), "scales differ from the oracle"
    assert (codes[m] == 0xA5).all() and (scales[m] == 0xA5).all(), "a store ran past the last row"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [262144, 1, 17, 4097])
def test_rotate_gpu_bit_exact(m):
    _run_gpu(m)


@pytest.mark.gpu
@needs_cuda
def test_rotate_gpu_strided_rows():
    _run_gpu(1001, stride=136)


@pytest.mark.gpu
@needs_cuda
def test_rotate_gpu_subnormal_rows():
    """bf16 subnormals after the rotation: the bf16x2 multiply must not flush them (a flushed value
    would read as code 0 where the oracle has up to 7)."""
    _run_gpu(515, tiny_rows=True)
