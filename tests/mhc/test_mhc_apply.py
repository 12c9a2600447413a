"""mHC pass 2 (hc_pre / hc_head apply, v2) on a CPU: the run-time grid choice fills an H100."""

from __future__ import annotations

import pytest

from kernels.mhc.apply import TOKENS, column_blocks, token_block


@pytest.mark.parametrize("d", [4096, 7168])
@pytest.mark.parametrize("t", [1, 64, 128, 1001, 4096, 16384])
def test_mhc_apply_grid_fills_an_h100(t, d):
    """~2 streaming CTAs per SM of a 132-SM H100 from T = 64 on (256 for Flash T = 64: 4 column
    blocks x 64 tokens), every token in exactly one token block, 32-token blocks at prefill."""
    tb = token_block(t, d)
    blocks = -(-t // tb)
    assert 1 <= tb <= TOKENS and (blocks - 1) * tb < t <= blocks * tb
    if t >= 64:
        assert blocks * column_blocks(d) >= 256
    if t >= 4096:
        assert tb == TOKENS


@pytest.mark.parametrize("d", [8, 1000, 4056, 4096, 7168])
@pytest.mark.parametrize("t", [1, 20, 37, 64, 65, 128, 1001, 4096, 4097, 16384])
def test_mhc_mix_v4_tiling(t, d):
    """Pass 1 (v4): 64·tm tokens per CTA (4 warps x tm MMA row tiles of 16), a K chunk that divides
    4·D into 32-column multiples and holds whole k16 MMA steps per stage, ~2 CTAs per SM once T
    allows it, >= 4 CTAs per SM by shared memory."""
    from kernels.mhc.family import N_MIX
    from kernels.mhc.mix import MIN_CHUNK, HcMixKernel, pick_tiling

    k = 4 * d
    tm, chunk = pick_tiling(k, t)
    assert tm == (2 if t > 64 else 1)
    assert k % chunk == 0 and chunk % 32 == 0 and chunk <= 1024
    for n_mix in N_MIX.values():
        mix = HcMixKernel(n_mix, k, chunk, tm)
        assert mix.tokc == 64 * tm and mix.np % 8 == 0 and mix.np - 8 < n_mix <= mix.np
        assert mix.sub % 16 == 0 and mix.chunk % mix.sub == 0 and mix.tokc * mix.sub // 8 % 128 == 0
        assert mix.smem_words() * 4 <= 56 * 1024  # >= 4 CTAs per SM by shared memory
    if k % MIN_CHUNK == 0 and chunk > MIN_CHUNK:
        assert -(-t // (64 * tm)) * (k // chunk) >= 264
