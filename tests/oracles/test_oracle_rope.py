import math

import torch
from hypothesis import given, settings, strategies as st

from oracles.rope import (COMPRESSED_ROPE, SWA_ROPE, RopeConfig, apply_rope, apply_rope_lowprec,
                          rope_config_for_ratio, rope_freqs, yarn_band)

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**31 - 1)
configs = st.sampled_from([SWA_ROPE, COMPRESSED_ROPE])


def test_yarn_band_for_base_160000_is_15_to_25():
    assert yarn_band(COMPRESSED_ROPE) == (15, 25)


def test_yarn_blends_frequencies_exactly_inside_the_band():
    plain = 1.0 / 160000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    yarn = rope_freqs(COMPRESSED_ROPE, torch.float64)
    assert torch.equal(yarn[:16], plain[:16])  # i ≤ 15 unscaled
    torch.testing.assert_close(yarn[25:], plain[25:] / 16, rtol=1e-15, atol=0)  # i ≥ 25 divided by 16
    ramp = (torch.arange(16, 25, dtype=torch.float64) - 15) / 10
    torch.testing.assert_close(yarn[16:25], plain[16:25] * (1 - ramp) + plain[16:25] / 16 * ramp)


def test_layer_tables_follow_the_compress_ratio():
    assert rope_config_for_ratio(0) == SWA_ROPE and SWA_ROPE.original_seq_len == 0
    assert rope_config_for_ratio(4) == rope_config_for_ratio(128) == COMPRESSED_ROPE
    plain = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    torch.testing.assert_close(rope_freqs(SWA_ROPE, torch.float64), plain, rtol=1e-15, atol=0)
    torch.testing.assert_close(rope_freqs(SWA_ROPE).double(), plain, rtol=1e-6, atol=0)


@SETTINGS
@given(seed=seeds, cfg=configs, max_pos=st.sampled_from([10, 10_000, 1_000_000]))
def test_inverse_after_forward_is_identity(seed, cfg, max_pos):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 3, 512, generator=g, dtype=torch.float64)
    pos = torch.randint(0, max_pos, (6, 1), generator=g)
    freqs = rope_freqs(cfg, torch.float64)
    y = apply_rope(x, pos, freqs)
    torch.testing.assert_close(apply_rope(y, pos, freqs, inverse=True), x, rtol=0, atol=1e-12)
    assert torch.equal(y[..., :448], x[..., :448]), "the 448 NoPE dims are untouched"
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # rotation preserves norms


@SETTINGS
@given(seed=seeds, cfg=configs)
def test_rotation_matches_the_interleaved_pair_formula(seed, cfg):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 128, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 5000, (4,), generator=g)
    freqs = rope_freqs(cfg, torch.float64)
    y = apply_rope(x, pos, freqs)
    i = torch.randint(0, 32, (1,), generator=g).item()
    theta = pos.double() * freqs[i]
    a, b = x[:, 64 + 2 * i], x[:, 64 + 2 * i + 1]
    torch.testing.assert_close(y[:, 64 + 2 * i], a * torch.cos(theta) - b * torch.sin(theta))
    torch.testing.assert_close(y[:, 64 + 2 * i + 1], a * torch.sin(theta) + b * torch.cos(theta))


@SETTINGS
@given(seed=seeds, cfg=configs)
def test_scores_depend_only_on_relative_position(seed, cfg):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 64, generator=g, dtype=torch.float64)
    p, r, shift = (torch.randint(0, 4000, (), generator=g) for _ in range(3))
    freqs = rope_freqs(cfg, torch.float64)
    s1 = apply_rope(q, p, freqs) @ apply_rope(k, r, freqs)
    s2 = apply_rope(q, p + shift, freqs) @ apply_rope(k, r + shift, freqs)
    torch.testing.assert_close(s1, s2)


@SETTINGS
@given(seed=seeds, cfg=configs)
def test_lowprec_rounds_only_at_the_end(seed, cfg):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2, 512, generator=g).bfloat16()
    pos = torch.randint(0, 100_000, (3, 1), generator=g)
    freqs = rope_freqs(cfg)
    y = apply_rope_lowprec(x, pos, freqs)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, apply_rope(x, pos, freqs).bfloat16())
    assert torch.equal(y[..., :448], x[..., :448])


def test_fp32_table_is_close_to_true_math_and_yarn_guard_handles_equal_band():
    f32, f64 = rope_freqs(COMPRESSED_ROPE), rope_freqs(COMPRESSED_ROPE, torch.float64)
    torch.testing.assert_close(f32.double(), f64, rtol=1e-6, atol=0)
    degenerate = RopeConfig(base=10000.0, original_seq_len=4096, beta_fast=8.0, beta_slow=8.0)
    low, high = yarn_band(degenerate)
    assert low == math.floor(64 * math.log(4096 / (16 * math.pi)) / (2 * math.log(10000.0)))
    assert torch.isfinite(rope_freqs(degenerate)).all()
