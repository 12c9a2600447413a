import math

import torch
from hypothesis import given, settings, strategies as st

from oracles import quant as Q

SETTINGS = settings(max_examples=30, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def _rand(seed, *shape, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    # log-uniform magnitudes so blocks exercise many scale exponents
    mag = torch.exp(torch.empty(shape).uniform_(-spread, spread, generator=g))
    return mag * torch.randn(shape, generator=g).sign()


def _e4m3_values():
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().nan_to_num(0.0)


@SETTINGS
@given(seed=seeds, block=st.sampled_from([32, 64, 128]), fmt=st.sampled_from(["ue8m0", None]))
def test_fp8_scale_rule_and_error_bound(seed, block, fmt):
    x = _rand(seed, 3, 2 * block)
    codes, scale = Q.fp8_block_quant(x, block, fmt)
    amax = x.unflatten(-1, (-1, block)).abs().amax(-1).clamp(min=1e-4).double()
    if fmt == "ue8m0":
        log2 = torch.log2(scale.double())
        assert torch.equal(log2, log2.round()), "ue8m0 scales must be powers of two"
        # smallest power of two with amax/s <= 448 (up to the fp32 rounding of amax·(1/448))
        assert torch.all(amax / scale <= 448 * (1 + 2**-23)) and torch.all(amax / scale > 224 * (1 - 2**-23))
    else:
        torch.testing.assert_close(scale.double(), amax / 448, rtol=2e-7, atol=0)
    # e4m3 has 3 mantissa bits: RNE error ≤ 2^-4 relative for normals, ≤ 2^-10·s absolute for subnormals
    err = (Q.fp8_block_dequant(codes, scale, block) - x).abs().unflatten(-1, (-1, block))
    bound = torch.maximum(x.abs().unflatten(-1, (-1, block)) * 2**-4, scale.unsqueeze(-1) * 2**-10)
    assert torch.all(err <= bound * (1 + 1e-6))


@SETTINGS
@given(seed=seeds, exponent=st.integers(-20, 20))
def test_fp8_round_trip_is_bit_exact_on_representable_values(seed, exponent):
    g = torch.Generator().manual_seed(seed)
    values = _e4m3_values()
    x = values[torch.randint(0, 256, (4, 64), generator=g)]
    x[:, 0] = 448.0  # pins amax so the ue8m0 scale is exactly 1 (then scaled by 2^exponent)
    x = x * 2.0**exponent
    assert torch.equal(Q.fp8_qdq(x, 64), x)
    codes, scale = Q.fp8_block_quant(x, 64)
    assert torch.equal(scale, torch.full((4, 1), 2.0**exponent))


@SETTINGS
@given(seed=seeds)
def test_fp8_qdq_is_idempotent_and_lowprec_is_its_cast(seed):
    x = _rand(seed, 2, 448).bfloat16()
    y = Q.fp8_qdq(x, 64)
    assert torch.equal(Q.fp8_qdq(y, 64), y)
    assert torch.equal(Q.fp8_qdq_lowprec(x, 64), y.bfloat16())
    assert torch.equal(y.bfloat16().float(), y), "e4m3·2^k is exact in bf16"


def test_e2m1_rounding_is_nearest_even_at_every_midpoint():
    grid = torch.tensor(Q.E2M1_GRID)
    mids = (grid[:-1] + grid[1:]) / 2
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])  # the even-code neighbour
    assert torch.equal(Q.round_to_e2m1(mids), expected)
    assert torch.equal(Q.round_to_e2m1(-mids), -expected)
    assert torch.equal(Q.round_to_e2m1(torch.tensor([7.0, -100.0])), torch.tensor([6.0, -6.0]))


@SETTINGS
@given(seed=seeds)
def test_e2m1_rounding_picks_a_nearest_grid_point(seed):
    x = torch.empty(500).uniform_(-6, 6, generator=torch.Generator().manual_seed(seed))
    grid = torch.tensor(Q.E2M1_GRID)
    signed = torch.cat((-grid, grid))
    best = (x.unsqueeze(-1) - signed).abs().min(-1).values
    assert torch.equal((Q.round_to_e2m1(x) - x).abs(), best)


@SETTINGS
@given(seed=seeds, exponent=st.integers(-30, 30))
def test_mxfp4_round_trip_is_bit_exact_and_scales_are_powers_of_two(seed, exponent):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (3, 64), generator=g, dtype=torch.uint8)
    codes[:, ::32] = 7  # each 32-block holds a ±6, so its scale is exactly 2^exponent
    x = Q.e2m1_decode(codes) * 2.0**exponent
    q_codes, scale = Q.mxfp4_quant(x)
    assert torch.equal(scale, torch.full((3, 2), 2.0**exponent))
    assert torch.equal(Q.mxfp4_dequant(q_codes, scale), x)
    assert torch.equal(Q.fp4_qdq(x), x)


@SETTINGS
@given(seed=seeds)
def test_mxfp4_scale_rule_and_error_bound(seed):
    x = _rand(seed, 4, 64)
    codes, scale = Q.mxfp4_quant(x)
    log2 = torch.log2(scale.double())
    assert torch.equal(log2, log2.round())
    amax = x.unflatten(-1, (-1, 32)).abs().amax(-1).double()
    assert torch.all(amax / scale <= 6 * (1 + 2**-23)) and torch.all(amax / scale > 3 * (1 - 2**-23))
    # e2m1 spacing is ≤ 2·s for |x|/s ≥ 4 and ≤ s below: half-spacing bounds the error
    err = (Q.mxfp4_dequant(codes, scale) - x).abs().unflatten(-1, (-1, 32))
    assert torch.all(err <= scale.unsqueeze(-1) * 1.0 + 1e-12)
    assert torch.equal(Q.fp4_qdq_lowprec(x.bfloat16()), Q.fp4_qdq(x.bfloat16()).bfloat16())


@SETTINGS
@given(seed=seeds)
def test_fp4_nibble_packing_matches_the_checkpoint_layout(seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (5, 10), generator=g, dtype=torch.uint8)
    packed = Q.pack_fp4(codes)
    assert packed.shape == (5, 5)
    for k in range(5):  # element 2k in the low nibble, 2k+1 in the high nibble (§11.2)
        assert torch.equal(packed[:, k] % 16, codes[:, 2 * k])
        assert torch.equal(packed[:, k] // 16, codes[:, 2 * k + 1])
    assert torch.equal(Q.unpack_fp4(packed.view(torch.int8)), codes)


def test_e2m1_code_table_matches_the_checkpoint_table():
    table = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
    assert Q.e2m1_decode(torch.arange(16)).tolist() == table


@SETTINGS
@given(seed=seeds)
def test_ue8m0_encode_decode_and_torch_e8m0_agree(seed):
    k = torch.randint(-126, 127, (50,), generator=torch.Generator().manual_seed(seed))
    scale = torch.ldexp(torch.ones(50), k)
    byte = Q.ue8m0_encode(scale)
    assert torch.equal(byte.to(torch.int64), k + 127)
    assert torch.equal(Q.ue8m0_decode(byte), scale)
    assert torch.equal(Q.ue8m0_decode(scale.to(torch.float8_e8m0fnu)), scale)


@SETTINGS
@given(x=st.floats(1e-30, 1e30, allow_subnormal=False))
def test_pow2_ceil_is_the_smallest_power_of_two_not_below_x(x):
    x32 = torch.tensor([x], dtype=torch.float32)
    p = Q.pow2_ceil(x32).item()
    xv = x32.item()
    assert p >= xv and p / 2 < xv
    assert math.log2(p) == round(math.log2(p))


@SETTINGS
@given(seed=seeds, out_f=st.integers(1, 300), in_blocks=st.integers(1, 3))
def test_fp8_weight_dequant_uses_128x128_block_scales(seed, out_f, in_blocks):
    in_f = 128 * in_blocks - 7 * (in_blocks > 1)
    w = _rand(seed, out_f, in_f, spread=2.0)
    codes, scale = Q.quant_fp8_weight(w)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (math.ceil(out_f / 128), math.ceil(in_f / 128))
    deq = Q.dequant_fp8_weight(codes, scale)
    s = Q.ue8m0_decode(scale)
    rows, cols = torch.arange(out_f).unsqueeze(1), torch.arange(in_f)
    assert torch.equal(deq, codes.float() * s[rows // 128, cols // 128])
    assert torch.all((deq - w).abs() <= w.abs() * 2**-4 + s.max() * 2**-10)


@SETTINGS
@given(seed=seeds)
def test_fp4_weight_round_trip_and_scale_layout(seed):
    w = _rand(seed, 6, 64, spread=2.0)
    packed, scale = Q.quant_fp4_weight(w)
    assert packed.dtype == torch.int8 and packed.shape == (6, 32) and scale.shape == (6, 2)
    deq = Q.dequant_fp4_weight(packed, scale)
    assert torch.equal(deq, Q.fp4_qdq(w))
    assert torch.equal(Q.dequant_fp4_weight(*Q.quant_fp4_weight(deq)), deq), "re-quantising is lossless"


@SETTINGS
@given(seed=seeds)
def test_nvfp4_uses_e4m3_block_scales_per_16_and_a_global_scale(seed):
    x = _rand(seed, 4, 64, spread=3.0)
    codes, block_scale, global_scale = Q.nvfp4_quant(x)
    assert block_scale.dtype == torch.float8_e4m3fn and block_scale.shape == (4, 4)
    torch.testing.assert_close(global_scale, x.abs().amax() / (6 * 448))
    step = block_scale.float() * global_scale
    deq = Q.nvfp4_dequant(codes, block_scale, global_scale)
    # each code is a nearest e2m1 point to x/(block_scale·global_scale)
    scaled = (x.unflatten(-1, (-1, 16)) / step.unsqueeze(-1)).clamp(-6, 6)
    grid = torch.tensor(Q.E2M1_GRID)
    nearest = (scaled.unsqueeze(-1) - torch.cat((-grid, grid))).abs().min(-1).values
    assert torch.equal((Q.e2m1_decode(codes).unflatten(-1, (-1, 16)) - scaled).abs(), nearest)
    err = (deq - x).abs().unflatten(-1, (-1, 16))
    amax = x.abs().unflatten(-1, (-1, 16)).amax(-1, keepdim=True)
    assert torch.all(err <= step.unsqueeze(-1) + amax * 2**-3)
    # packed storage round trip
    packed, bs, gs = Q.quant_nvfp4_weight(x)
    assert torch.equal(Q.dequant_nvfp4_weight(packed, bs, gs), deq)


@SETTINGS
@given(seed=seeds, exponent=st.integers(-6, 6))
def test_nvfp4_round_trip_is_exact_on_representable_values(seed, exponent):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (2, 32), generator=g, dtype=torch.uint8)
    codes[:, ::16] = 7
    x = Q.e2m1_decode(codes) * 2.0**exponent
    global_scale = torch.tensor(2.0**exponent)  # every block scale is then exactly 1.0 in e4m3
    assert torch.equal(Q.nvfp4_qdq(x, global_scale=global_scale), x)
