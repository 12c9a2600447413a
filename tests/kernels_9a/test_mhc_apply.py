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
