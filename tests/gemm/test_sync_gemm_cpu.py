"""The mma.sync small-M kernel's rule and compile on the CPU (kernels/gemm/sync_sm90.py)."""

from __future__ import annotations

import pytest

from kernels.gemm.glue import compile_sync_gemm
from kernels.gemm.sync_sm90 import SyncConfig, choose_sync_config
from sweeps.gemm import LAYERS


@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 64])
def test_rule_takes_every_m_to_64(m):
    for _, _, n, k, _ in LAYERS:
        cfg = choose_sync_config(m, n, k)
        assert cfg.max_m >= m and 8 <= cfg.warps <= 16 and cfg.k_slices <= k // 128
        assert cfg.half == (m <= 8)


def test_rule_refuses_past_64_rows():
    with pytest.raises(ValueError, match="M <= 64"):
        choose_sync_config(65, 1024, 4096)


@pytest.mark.parametrize("bad", [dict(depth=3), dict(m_tiles=2), dict(row_warps=2, k_slices=32), dict(m_tiles=5,
                                                                                                      half=False)])
def test_config_refuses_what_it_cannot_build(bad):
    with pytest.raises(ValueError):
        SyncConfig(**bad)


@pytest.mark.parametrize("m,n,k", [(1, 1024, 4096), (8, 32768, 1024), (16, 512, 7168), (64, 7168, 16384)])
def test_compiles_for_sm90a(m, n, k):
    assert compile_sync_gemm(choose_sync_config(m, n, k)) is not None
