"""The check both tile rules' CPU tests make of every configuration the rule picks for the model's
shapes (FP8: kernels/gemm/config.py in tests/gemm/test_gemm_cpu.py; bf16: kernels/gemm/bf16_config.py
in tests/gemm/test_bf16_gemm_cpu.py): it costs no more in the rule's own model than a plain tile."""

from __future__ import annotations


def assert_no_worse_than_plain_tiles(cost, cfg, m: int, n: int, k: int, tiles) -> None:
    """`cfg` (the rule's pick for M x N x K) costs at most one clock more than each unsplit (bm, bn)
    of `tiles` that suits M (decode, M <= 64, takes bm 64 only)."""
    best = cost(m, n, k, cfg.bm, cfg.bn, cfg.split_k)
    for bm, bn in tiles:
        if m <= 64 and bm > 64:
            continue
        assert best <= cost(m, n, k, bm, bn, 1) + 1, (m, n, k, cfg, (bm, bn))
