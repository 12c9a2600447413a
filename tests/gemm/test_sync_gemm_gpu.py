"""The mma.sync small-M kernel (kernels/gemm/sync_sm90.py) against the oracle: every M of 1-64 the rule maps to
its three fragment shapes (half tile, one and four 16-token tiles), ragged N (one 8-row group, a partial CTA),
K of one block to 16384 (empty and partial K slices), grouped wo_a, and each loading depth."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels.gemm.glue import compile_sync_gemm, make_operands, oracle_of, run_sync_gemm
from kernels.gemm.sync_sm90 import choose_sync_config

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}


def _run(m, n, k, groups=1, seed=0, **knobs):
    x, sa, w, sw = make_operands(m, n, k, seed, "cuda", groups)
    cfg = replace(choose_sync_config(m, n, k), **knobs)
    if cfg not in _COMPILED:
        _COMPILED[cfg] = compile_sync_gemm(cfg)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    run_sync_gemm(_COMPILED[cfg], cfg, x, sa, w, sw, y, groups)
    torch.cuda.synchronize()
    ref = oracle_of(x, sa, w, sw, groups)
    low = ref.bfloat16().float()
    err = (y.float() - ref).abs()
    bound = 2 * (low - ref).abs().max() + ref.abs().max() * 2.0 ** -8
    rel = (y.float() - ref).norm() / ref.norm()
    assert not torch.isnan(y).any(), f"{m}x{n}x{k} {cfg}: NaN (unwritten?) at {torch.isnan(y).nonzero()[:4].tolist()}"
    worst = divmod(int(err.argmax()), n)
    assert err.max() <= bound and rel < 1e-2, (
        f"{m}x{n}x{k} {cfg}: max err {err.max():.4g} (bound {bound:.4g}) at {worst}, rel {rel:.3g}")


SHAPES = [
    (1, 1024, 4096), (8, 512, 4096), (3, 1536, 7168), (16, 4096, 8192), (9, 8, 128), (64, 7168, 1024),
    (33, 136, 384), (17, 4104, 1024), (1, 7168, 16384), (50, 1000, 1280), (5, 32768, 1024), (64, 24, 7168),
]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_sync_rule(m, n, k):
    _run(m, n, k)


@pytest.mark.parametrize("groups,m", [(8, 1), (8, 40), (16, 8)])
def test_sync_grouped(groups, m):
    _run(m, groups * 256, 512, groups=groups)


@pytest.mark.parametrize("depth", [1, 4, 8])
@pytest.mark.parametrize("m,n,k", [(1, 1000, 7168), (20, 512, 3072)])
def test_sync_depths(m, n, k, depth):
    _run(m, n, k, depth=depth)


def test_sync_refuses_past_its_rows():
    x, sa, w, sw = make_operands(9, 64, 256, 0, "cuda")
    cfg = choose_sync_config(8, 64, 256)
    with pytest.raises(ValueError, match="x has M = 9"):
        run_sync_gemm(compile_sync_gemm(cfg), cfg, x, sa, w, sw, torch.empty(9, 64, dtype=torch.bfloat16,
                                                                            device="cuda"))
