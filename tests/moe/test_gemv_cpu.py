"""The GEMV decode path (`cutedsl:gemv`, kernels/moe/gemv_sm90.py) on the CPU: the kernels' bit-level decodes
(e2m1 and e4m3 placed at the subnormal-aligned fp32 bits), the torch emulation of the kernels' order
(kernels/moe/gemv_emulate.py) against the family's low-precision reference, the variant's supports
reasons, and compiles of both GEMVs for sm_90a and sm_100a at the Flash and Pro widths with no local
memory (spills)."""

from __future__ import annotations

import struct

import pytest
import torch

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_family, get_impl
from kernels.moe.gemv_emulate import emulate_layer, gemv_sums
from kernels.moe.gemv_layer import compile_gemv, compile_gemv_layer, gemv_config, pick_tmax, unit_balance
from kernels.moe.gemv_sm90 import MAG, SIGN, GemvConfig
from kernels.moe.inputs import counts, make_experts
from oracles.quant import E2M1_GRID
from sweeps import moe as space

FAMILY = get_family("moe")
GEMV = get_impl("moe", "cutedsl:gemv")
SHAPES = {"flash": (4096, 2048), "pro": (7168, 3072)}


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _sra(v: int, n: int) -> int:  # int32 arithmetic shift right
    v &= 0xFFFFFFFF
    return ((v - (1 << 32)) if v & 0x80000000 else v) >> n


@pytest.mark.parametrize("c", range(8))
def test_e2m1_decode_bits(c):
    """gemv_sm90.e2m1_f32's bit ops (code c of a word to the top, arithmetic shift by 6, AND): every nibble
    in every position, with random neighbours, is its e2m1 value times 2^-126."""
    g = torch.Generator().manual_seed(c)
    for nib in range(16):
        for other in torch.randint(0, 2**32, (4,), generator=g).tolist():
            w = (other & ~(0xF << 4 * c)) | (nib << 4 * c)
            top = w if c == 7 else (w << (28 - 4 * c))
            got = _f32(_sra(top, 6) & ((SIGN | MAG) & 0xFFFFFFFF))
            want = (-1.0 if nib & 8 else 1.0) * E2M1_GRID[nib & 7] * 2.0**-126
            assert got == want, (c, nib, hex(w))


def test_e4m3_decode_bits():
    """gemv_sm90.e4m3_f32 (magnitude at bits 20-26, sign at 31) times 2^120 is the e4m3 value, every finite byte."""
    for b in range(256):
        if b & 0x7F == 0x7F:  # NaN
            continue
        want = float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        assert _f32(((b & 0x7F) << 20) | ((b & 0x80) << 24)) * 2.0**120 == want, b


def _inputs(e, d, i, t, load, seed):
    case = Case("moe", {**space.case("layer", "drawn", t, load, e, d, i), "layout": "masked"})
    return case, FAMILY.make_inputs(case, torch.Generator().manual_seed(seed), "cpu")


@pytest.mark.parametrize("e, d, i, t, load", [(8, 1024, 1024, 1, "uniform"), (8, 1024, 2048, 4, "uniform"),
                                              (16, 2048, 1024, 3, "hash"), (12, 1024, 1024, 2, "sparse")])
def test_emulation_matches_the_lowprec_reference(e, d, i, t, load):
    """The kernels' arithmetic in their order (exact products, per-chunk fp32 sums, the butterfly, the warps in
    order, the epilogues' roundings) gives the reference's bf16 output: the bf16 roundings of g / u, h and y
    absorb the summation order (equal on these draws; the bound allows a rare one-ulp flip)."""
    case, inp = _inputs(e, d, i, t, load, seed=e + d + t)
    assert int(counts(case).max()) <= 4
    experts = tuple(inp[n] for n in ("w1", "s1", "w3", "s3", "w2", "s2"))
    got = emulate_layer(inp["x"], inp["idx"], inp["weights"], inp["shared"], experts, e, 16).float()
    want = FAMILY.lowprec(case, inp)["out"].float()
    assert float((got - want).norm() / want.norm()) < 1e-3
    oracle = FAMILY.oracle(case, inp)["out"]
    assert (got - oracle).abs().max() <= 2 * (want - oracle).abs().max() + 1e-6


def test_emulated_sums_are_the_exact_dot_products():
    """gemv_sums against an fp64 dot product of the dequantised operands: fp32 accumulation error only."""
    g = torch.Generator().manual_seed(3)
    ex = make_experts(1, 1024, 64, g, "cpu")
    xv = torch.randn(2, 1024, generator=g).to(torch.float8_e4m3fn).float()
    sx = torch.exp2(torch.randint(-8, 4, (2, 8), generator=g).float())
    got = gemv_sums(ex.w1[0], ex.s1[0], xv, sx).double()
    from oracles.quant import mxfp4_dequant, unpack_fp4
    w = mxfp4_dequant(unpack_fp4(ex.w1[0]), ex.s1[0].view(torch.uint8)).double()
    want = w @ (xv.double() * sx.double().repeat_interleave(128, -1)).t()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_supports_reasons():
    flash1 = Case("moe", space.case("layer", "flash", 1))
    assert GEMV.variant == "gemv" and GEMV.checked
    assert GEMV.supports(flash1, "sm_90a") is None and GEMV.supports(flash1, "sm_100a") is None
    assert "masked" in GEMV.supports(Case("moe", space.case("layer", "flash", 4096)), "sm_90a")
    assert GEMV.supports(Case("moe", space.case("layer", "pro", 64))) is None  # 29 tokens an expert: 8 chunks of 4
    assert "layer" in GEMV.supports(Case("moe", space.case("dispatch", "flash", 1)))
    small = Case("moe", {**space.case("layer", "drawn", 1, "uniform", 8, 384, 256), "layout": "masked"})
    assert "multiples of 1024" in GEMV.supports(small)
    assert pick_tmax(1) == 1 and pick_tmax(3) == 4 and pick_tmax(5) == 4 and pick_tmax(300) == 4
    # the default path is untouched: `cutedsl` stays SM90-only
    assert get_impl("moe", "cutedsl").supports(flash1, "sm_100a") is not None


def test_config_refuses_bad_widths():
    with pytest.raises(ValueError, match="multiple of 1024"):
        GemvConfig("l1", 2048, 4096 + 128)
    with pytest.raises(ValueError, match="tmax"):
        GemvConfig("l1", 2048, 4096, tmax=3)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("tmax", [1, 4])
@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("stage", ["l1", "l2"])
def test_gemv_compiles_without_spills(stage, model, tmax, arch):
    d, i = SHAPES[model]
    info = parse_cubin(artifact(compile_gemv(stage, d, i, tmax, arch)))
    assert info.sm == (90 if arch == "sm_90a" else 100)
    assert info.local_bytes == 0, f"{info.local_bytes} B of local memory (spills)"
    cfg = gemv_config(stage, d, i, tmax)
    assert info.registers * cfg.threads * cfg.min_ctas <= 65536


def test_unit_size_balances_the_one_token_layer():
    """pick_pairs: 16 row pairs a unit unless its one-token layer (top-k active experts) would leave more
    than 15% of the CTA slots idle; Flash L1 at tmax 1: 768 units of 16 over 528 slots (73% busy) -> 8."""
    assert unit_balance(768, 528) == pytest.approx(768 / 1056) and unit_balance(1536, 528) == pytest.approx(1536 / 1584)
    assert unit_balance(0, 528) == 0.0 and unit_balance(528, 528) == 1.0
    picks = {(m, st, t): gemv_config(st, *SHAPES[m], t, topk=6).pairs for m in SHAPES for st in ("l1", "l2")
             for t in (1, 4)}
    assert picks[("flash", "l1", 1)] == 8 and picks[("flash", "l2", 1)] == 4 and picks[("pro", "l1", 1)] == 16
    for (m, st, t), p in picks.items():
        cfg = gemv_config(st, *SHAPES[m], t, topk=6)
        assert p * t <= cfg.threads and cfg.units_per_expert * p == (cfg.n if st == "l1" else cfg.n // 2)
    assert all(gemv_config(st, *SHAPES[m], t).pairs == 16 for m, st, t in picks)  # without topk: 16
    with pytest.raises(ValueError, match="pairs must be"):
        GemvConfig("l1", 2048, 4096, pairs=2)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("stage", ["l1", "l2"])
@pytest.mark.parametrize("model", list(SHAPES))
def test_fine_units_compile_without_spills(stage, model, arch):
    d, i = SHAPES[model]
    cfg = gemv_config(stage, d, i, 1, topk=6)
    info = parse_cubin(artifact(compile_gemv(stage, d, i, 1, arch, topk=6)))
    assert info.sm == (90 if arch == "sm_90a" else 100)
    assert info.local_bytes == 0 and info.registers * cfg.threads * cfg.min_ctas <= 65536


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_layer_compiles_for_both_archs(arch):
    """dispatch, both GEMVs and combine at a small width (the variant's compile)."""
    layer = compile_gemv_layer(8, 6, 1024, 1024, 1, arch)
    assert set(layer.kernels) == {"dispatch", "l1", "l2", "combine"} and layer.tmax == 1
