"""The SM90 kernel against the oracle on the H100: production-like, ragged, multi-tile shapes and
every code path (bm 16/32/64/128/256, bn 32/64/128/192, split-K, grouped)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels.gemm.config import choose_config
from kernels.gemm.tiling import GemmConfig
from kernels.gemm.glue import compile_gemm, make_operands, oracle_of, run_gemm

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}


def _run(m, n, k, cfg=None, seed=0, groups=1):
    x, sa, w, sw = make_operands(m, n, k, seed, "cuda", groups)
    cfg = cfg or choose_config(m, n, k, groups=groups)
    if cfg not in _COMPILED:
        _COMPILED[cfg] = compile_gemm(cfg)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    run_gemm(_COMPILED[cfg], cfg, x, sa, w, sw, y, groups)
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
    return y


SHAPES = [
    (1, 1024, 4096), (8, 1536, 7168), (64, 7168, 1024), (200, 1000, 1024), (4096, 1024, 128),
    (4096, 1536, 7168), (64, 1000, 7168), (1, 7168, 128), (200, 7168, 7168), (300, 4096, 1024),
    (8, 512, 4096), (4096, 1000, 1024), (129, 136, 384), (64, 7168, 16384), (4097, 4104, 1024),
    (300, 2048, 512), (1000, 8192, 256),
    # batches of 65-128 rows (64-row tiles, two M tiles, full rings): one slice, split-K merged in global memory
    # where few tiles (N 512)
    (96, 1024, 4096), (128, 512, 7168), (100, 1536, 7168), (128, 4096, 8192),
    # M 129-256 (config.SMALL_M): 64-row tiles in one slice, chained, 3-4 M tiles; full rings; ragged M
    (256, 512, 4096), (192, 4096, 8192), (250, 1536, 7168), (129, 1024, 4096),
    (192, 7168, 2048), (150, 3000, 1024),  # 64 x 192 tiles (N 7168: a partial last tile); ragged N
    (200, 32768, 1024), (256, 65536, 1536),  # one 256-row M tile (config.one_m_tile): ragged M, pro.wq_b at M 256
    # past 256 rows, fewer than four 256-row M tiles (config.row_tiles): 128 x 192 on 3 / 6 M tiles (ragged M and N),
    # 128 x 64 and 64 x 32 chained in one slice
    (300, 7168, 2048), (700, 3000, 1024), (600, 1000, 4096), (400, 512, 4096),
]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_rule(m, n, k):
    _run(m, n, k)


CONFIGS = [
    GemmConfig(128, 128), GemmConfig(128, 64), GemmConfig(64, 128), GemmConfig(64, 64), GemmConfig(64, 32),
    GemmConfig(128, 128, split_k=3), GemmConfig(64, 64, split_k=5), GemmConfig(128, 32, stages=2),
    GemmConfig(128, 128, group_m=3), GemmConfig(128, 64, split_k=2), GemmConfig(256, 128), GemmConfig(256, 64),
    GemmConfig(256, 32, group_m=3), GemmConfig(256, 128, stages=2),
    # per-warpgroup epilogue: M = 1 and 200 leave one warpgroup's rows wholly past M
    GemmConfig(256, 128, epi_per_wg=True), GemmConfig(128, 64, split_k=2, epi_per_wg=True),
    # CTA pairs multicasting x: N = 2056 leaves the last pair's second tile wholly past N
    GemmConfig(256, 128, cluster_n=2), GemmConfig(256, 64, cluster_n=2, group_m=3),
    GemmConfig(256, 128, cluster_n=2, epi_per_wg=True),
    # 192 columns: two weight-scale blocks a tile, the middle 64 columns in the first (even tiles)
    # or the second (odd tiles); N = 1000 / 2056 end in partial tiles and past-N scale rows
    GemmConfig(128, 192), GemmConfig(64, 192), GemmConfig(128, 192, split_k=3), GemmConfig(64, 192, stages=2),
    GemmConfig(128, 192, group_m=3, epi_per_wg=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("m,n,k", [(200, 1000, 1024), (1, 7168, 2048), (1000, 2056, 640)])
def test_configs(cfg, m, n, k):
    _run(m, n, k, cfg)


@pytest.mark.parametrize("cfg", [None, GemmConfig(256, 128), GemmConfig(64, 64, split_k=3), GemmConfig(128, 32),
                                 GemmConfig(128, 128, chain=8),
                                 GemmConfig(256, 128, epi_per_wg=True), GemmConfig(256, 128, cluster_n=2)], ids=str)
@pytest.mark.parametrize("m,groups", [(1, 8), (300, 3), (4096, 16)])
def test_grouped(cfg, m, groups):
    """wo_a: output group g reads only x's g-th K range (a wrong group offset fails the oracle)."""
    _run(m, groups * 256, 512, cfg, groups=groups)


SMALL_X = [GemmConfig(16, 32), GemmConfig(16, 64, split_k=3), GemmConfig(16, 128, stages=2), GemmConfig(16, 192),
           GemmConfig(32, 64), GemmConfig(32, 128, split_k=2), GemmConfig(32, 32, split_k=5, stages=3)]


SMALL_X_SHAPES = [(1, 1000, 1024), (5, 7168, 640), (16, 2056, 2048), (17, 512, 384), (32, 136, 4096)]


@pytest.mark.parametrize("cfg,m,n,k", [(c, *shape) for c in SMALL_X for shape in SMALL_X_SHAPES if shape[0] <= c.bm],
                         ids=str)
def test_small_x_tiles(cfg, m, n, k):
    """16 / 32-row x tiles (decode): the m64 wgmma's rows past bm run on the next stages' bytes and
    must stay out of the output and the split-K sums; M up to bm, ragged N and K, ring wrap-around."""
    _run(m, n, k, cfg)


@pytest.mark.parametrize("cfg,m", [(GemmConfig(16, 64, x_box=1), 1), (GemmConfig(16, 64, x_box=2), 2),
                                   (GemmConfig(16, 64, chain=8, x_box=4), 3), (GemmConfig(32, 128, x_box=8), 5),
                                   (GemmConfig(16, 32, split_k=3, cluster_k=True, x_box=8), 8)], ids=str)
def test_x_boxes_of_m_rows(cfg, m):
    """x and sa loaded in boxes of fewer rows than the tile (GemmConfig.x_box, sa as a view over its padding
    rows): the stage rows past the box hold stale bytes, which must stay out of the output and the split-K sums."""
    _run(m, 1000, 1024, cfg)


CHAINS = [GemmConfig(16, 64, chain=4), GemmConfig(16, 32, chain=2, split_k=3), GemmConfig(32, 128, chain=8, stages=3),
          GemmConfig(64, 128, chain=4), GemmConfig(64, 64, chain=8, split_k=4, stages=2)]


@pytest.mark.parametrize("cfg,m,n,k", [(c, *shape) for c in CHAINS for shape in SMALL_X_SHAPES if shape[0] <= c.bm],
                         ids=str)
def test_k_block_chains(cfg, m, n, k):
    """Chains of K blocks (one consumer warpgroup, two temporaries): K of 3, 5, 8, 16 and 32 blocks
    end in partial chains and single blocks, split-K slices in empty ones; stages 2-3 hold both
    blocks of a chain link while the producer waits."""
    _run(m, n, k, cfg)


CHAINS_TWO_WG = [GemmConfig(128, 128, chain=8), GemmConfig(128, 64, chain=4, split_k=3),
                 GemmConfig(128, 32, chain=2, stages=2), GemmConfig(128, 128, chain=8, epi_per_wg=True)]


@pytest.mark.parametrize("cfg,m,n,k", [(c, *shape) for c in CHAINS_TWO_WG for shape in
                                       [(17, 512, 384), (200, 1000, 1024), (1000, 2056, 640), (129, 4104, 4096)]],
                         ids=str)
def test_k_block_chains_two_warpgroups(cfg, m, n, k):
    """Chains on 128-row tiles (two consumer warpgroups, each with its own two temporaries): several and ragged M
    tiles, rows wholly past M in the second warpgroup, split-K slices merged in global memory, a 2-stage ring."""
    _run(m, n, k, cfg)


@pytest.mark.parametrize("cfg", [GemmConfig(16, 64), GemmConfig(32, 128, split_k=2), GemmConfig(16, 64, chain=4)],
                         ids=str)
def test_small_x_tiles_grouped_and_few_ctas(cfg):
    _run(8, 8 * 256, 512, cfg, groups=8)
    x, sa, w, sw = make_operands(9, 2048, 1024, 4, "cuda")
    y = torch.empty(9, 2048, dtype=torch.bfloat16, device="cuda")
    run_gemm(compile_gemm(cfg), cfg, x, sa, w, sw, y, n_ctas=5)  # many units a CTA: the ring wraps
    ref = oracle_of(x, sa, w, sw)
    assert ((y.float() - ref).norm() / ref.norm()) < 4e-3


def test_split_k_counters_reset():
    """The fix-up leaves the counters at zero: a second call with the same workspace is right too."""
    for cfg, m in ((GemmConfig(64, 64, split_k=4), 64), (GemmConfig(16, 64, split_k=4), 16)):
        _run(m, 512, 4096, cfg, seed=1)
        _run(m, 512, 4096, cfg, seed=2)


CLUSTERS = [GemmConfig(16, 32, split_k=8, cluster_k=True, chain=8), GemmConfig(16, 64, split_k=3, cluster_k=True),
            GemmConfig(32, 128, split_k=2, cluster_k=True, chain=4), GemmConfig(64, 64, split_k=5, cluster_k=True, chain=8),
            GemmConfig(64, 32, split_k=4, cluster_k=True), GemmConfig(128, 64, split_k=2, cluster_k=True)]
CLUSTER_SHAPES = [(1, 512, 4096), (5, 136, 1024), (16, 1000, 640), (17, 512, 384), (64, 264, 7168), (100, 200, 2048)]


def _fits(cfg, m, n) -> bool:
    """A 16 / 32-row x tile holds M, and every slice of every tile runs in one round of the H100's 132 CTAs."""
    return (m <= cfg.bm or cfg.bm >= 64) and -(-m // cfg.bm) * -(-n // cfg.bn) * cfg.split_k <= 132


@pytest.mark.parametrize("cfg,m,n,k", [(c, *shape) for c in CLUSTERS for shape in CLUSTER_SHAPES
                                       if _fits(c, *shape[:2])], ids=str)
def test_split_k_clusters(cfg, m, n, k):
    """Split-K slices as one cluster, merged in the first slice's shared memory: 2-8 slices, slices
    past the last K block (K of 3 / 5 blocks in 8 slices send zeros), ragged M / N, several M tiles,
    16-row tiles whose idle warps send nothing, two consumer warpgroups (bm 128)."""
    _run(m, n, k, cfg)
    _run(m, n, k, cfg, seed=1)  # a second launch: the merge barrier starts afresh


@pytest.mark.parametrize("cfg", [GemmConfig(128, 128), GemmConfig(256, 128, cluster_n=2), GemmConfig(128, 192)],
                         ids=str)
def test_persistent_few_ctas(cfg):
    """Many tiles per CTA (8 CTAs walk every tile): the ring phases and epilogue buffers carry over."""
    x, sa, w, sw = make_operands(1000, 1024, 1024, 3, "cuda")
    y = torch.empty(1000, 1024, dtype=torch.bfloat16, device="cuda")
    run_gemm(compile_gemm(cfg), cfg, x, sa, w, sw, y, n_ctas=8)
    ref = oracle_of(x, sa, w, sw)
    assert ((y.float() - ref).norm() / ref.norm()) < 4e-3


STAMPED = [(GemmConfig(16, 32, chain=8, split_k=4, cluster_k=True, stages=16), 1, 512, 4096),
           (GemmConfig(16, 32, chain=8, stages=16, x_box=8), 8, 4096, 2048),
           (GemmConfig(64, 64, chain=8), 64, 1000, 1024)]


@pytest.mark.parametrize("cfg,m,n,k", STAMPED, ids=str)
def test_phase_stamps_leave_the_answer_and_come_in_order(cfg, m, n, k):
    """GemmConfig.stamps (benchmarks/gemm_phases.py): the stamped kernel's output is the plain one's, bit for bit, and
    every CTA's clock stamps run entry <= first load <= first stage <= end of mainloop <= exit."""
    from kernels.gemm.gemm_sm90 import STAMP_ENTRY, STAMP_EXIT, STAMP_FIRST_STAGE, STAMP_LOADS, STAMP_MAINLOOP
    from kernels.gemm.glue import workspace
    from kernels.gemm.tiling import STAMP_SLOTS

    plain = _run(m, n, k, cfg)
    stamped = replace(cfg, stamps=True)
    work, _ = workspace(stamped, m, n, "cuda")
    work.zero_()
    y = _run(m, n, k, stamped)
    assert torch.equal(y, plain)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    s = work.view(torch.int32)[: sms * STAMP_SLOTS].view(-1, STAMP_SLOTS).to(torch.int64).cpu()
    ran = s[s[:, STAMP_ENTRY] != 0]
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * cfg.split_k
    assert len(ran) == min(tiles, sms)
    order = [STAMP_ENTRY, STAMP_LOADS, STAMP_FIRST_STAGE, STAMP_MAINLOOP, STAMP_EXIT]
    steps = torch.stack([(ran[:, b] - ran[:, a]) % (1 << 32) for a, b in zip(order, order[1:])], 1)
    assert (steps < 10_000_000).all(), steps[:4]  # a backwards step wraps to ~4e9
    work.zero_()
