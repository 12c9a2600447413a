"""The bf16 GEMM (kernels/gemm/bf16_sm90.py) on the H100, against the FP32 oracle x.float() @ W.float().T
with fresh random inputs: non-square, ragged (M, N, K off every tile), multi-tile shapes through the
tile rule, every tile shape and split-K on ragged shapes, fp32 and bf16 output, the model's shapes
through the harness (poisoned outputs, the sweep's pass rule), and the served ops (lm_head,
compressor_project, indexer_weights) on their kernels against their oracles.

The kernel's bound: both operands are bf16 values, so every product is exact in fp32 and the kernel
differs from the oracle by summation order only: each element within 2 K 2^-24 (|x| . |W|^T) (the
worst case of any fp32 summation order, for the kernel and the oracle's own GEMM together) and
relative L2 <= 1e-4; unwritten elements stay NaN (the output is poisoned first)."""

from __future__ import annotations

import functools

import pytest
import torch

from dsv4bench.core.case import Case
from kernels.gemm.bf16_config import Bf16Config, choose_bf16_config
from kernels.gemm.bf16_glue import bf16_gemm, bf16_oracle, compile_bf16_gemm, draw_bf16_operands, run_bf16_gemm
from sweeps.gemm import BF16, BF16_GROUPED, BF16_LAYERS, BF16_M
from tests.gemm import bf16_served_checks as bc

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}


@pytest.fixture(autouse=True)
def exact_fp32_oracle():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the oracle's GEMM in true fp32
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def _assert_close(y, x, w, what: str, groups: int = 1):
    torch.cuda.synchronize()
    m = x.shape[0]
    n, k = w.shape
    assert not torch.isnan(y).any(), f"{what}: NaN (unwritten?) at {torch.isnan(y).nonzero()[:4].tolist()}"
    ref = bf16_oracle(x, w, groups)
    bound = 2 * k * 2.0**-24 * bf16_oracle(x.abs(), w.abs(), groups) + 1e-30
    if y.dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2.0**-8  # + the output's rounding (half a bf16 ulp, doubled)
    err = (y.float() - ref).abs()
    bad = err > bound
    rel = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    where = divmod(int((err / bound).argmax()), n)
    assert not bad.any(), f"{what}: {int(bad.sum())} elements outside the bound, worst at {where}: " \
                          f"{y[where].item()} vs {ref[where].item()}"
    assert rel <= (1e-4 if y.dtype == torch.float32 else 1e-2), f"{what}: rel L2 {rel:.3g}"


def _run(m, n, k, cfg=None, seed=0, out_dtype=torch.float32, repeat=1, groups=1):
    x, w = draw_bf16_operands(m, n, k, seed, device="cuda", groups=groups)
    cfg = cfg or choose_bf16_config(m, n, k, groups=groups)
    key = (cfg, out_dtype)
    if key not in _COMPILED:
        _COMPILED[key] = compile_bf16_gemm(cfg, out_dtype)
    for _ in range(repeat):  # split-K leaves its workspace zeroed: a second call gives the same sums
        y = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
        run_bf16_gemm(_COMPILED[key], cfg, x, w, y)
        _assert_close(y, x, w, f"{m}x{n}x{k} {cfg} {out_dtype} groups {groups}", groups)
    return y


SHAPES = [
    (1, 1, 8), (1, 129280, 4096), (3, 100, 72), (7, 1000, 4104), (64, 2048, 4096), (65, 257, 1000),
    (129, 515, 4096), (200, 64, 7168), (256, 1024, 7168), (300, 777, 576), (1000, 2049, 1032),
    (4096, 2048, 4096), (4097, 513, 4104), (2500, 300, 8), (33, 129281, 64),
]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_rule(m, n, k):
    _run(m, n, k, seed=m + n + k)


TILES = [Bf16Config(bm=bm, bn=bn, split_k=s) for bm in (64, 128) for bn in (64, 128, 256) for s in (1, 3)]


@pytest.mark.parametrize("cfg", TILES, ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 300, 4104), (197, 389, 1000), (300, 2000, 4096)])
def test_every_tile_shape_and_split_k(cfg, m, n, k):
    _run(m, n, k, cfg, seed=k, repeat=2)


def test_deep_split_and_a_two_stage_ring_wrap():
    _run(5, 64, 7168, Bf16Config(bm=64, bn=64, split_k=16), repeat=3)
    _run(130, 700, 2048, Bf16Config(bm=128, bn=256, stages=2), repeat=2)


@pytest.mark.parametrize("m,n,k,cfg", [(7, 1000, 4104, None), (300, 2048, 1024, None),
                                       (65, 640, 4096, Bf16Config(bm=64, bn=128, split_k=4))])
def test_bf16_output(m, n, k, cfg):
    _run(m, n, k, cfg, seed=3, out_dtype=torch.bfloat16)


def test_the_op_entry_point():
    x, w = draw_bf16_operands(37, 1234, 4096, 9, device="cuda")
    _assert_close(bf16_gemm(x, w), x, w, "bf16_gemm fp32")
    out = torch.empty(37, 1234, dtype=torch.bfloat16, device="cuda")
    assert bf16_gemm(x, w, out) is out
    _assert_close(out, x, w, "bf16_gemm bf16")


@pytest.mark.parametrize("layer", [f"{model}.{name}" for model, name, _, _ in BF16_LAYERS])
@pytest.mark.parametrize("m", BF16_M)
def test_model_shapes_pass_the_harness(layer, m, gpu_check):
    n, k = next((n, k) for model, name, n, k in BF16_LAYERS if f"{model}.{name}" == layer)
    gpu_check(Case("gemm", {"m": m, "n": n, "k": k, "layer": layer, "op": BF16}))
    if m <= 256:  # and the tight summation-order bound (the harness's yardstick is bf16 rounding)
        _run(m, n, k, seed=m)


@pytest.mark.parametrize("m", BF16_M)
@pytest.mark.parametrize("layer,n,k,groups", [(f"{model}.{name}", n, k, g) for model, name, n, k, g in BF16_GROUPED])
def test_grouped_wo_a_passes_the_harness_and_the_summation_bound(layer, n, k, groups, m, gpu_check):
    gpu_check(Case("gemm", {"m": m, "n": n, "k": k, "groups": groups, "layer": layer, "op": BF16}))
    _run(m, n, k, seed=m, groups=groups)


@pytest.mark.parametrize("cfg", [Bf16Config(bm=64, bn=64, split_k=3, group_n=192),
                                 Bf16Config(bm=128, bn=64, group_n=192), Bf16Config(bm=64, bn=64, group_n=192)],
                         ids=str)
@pytest.mark.parametrize("m", [1, 70, 300])
def test_grouped_tiles_and_split_k_take_each_groups_own_columns(cfg, m):
    """3 groups of 192 columns (3 N tiles a group): a tile that read the wrong group's x, or a split
    slice that started at the wrong K, fails the bound."""
    _run(m, 3 * 192, 640, cfg, seed=m, repeat=2, groups=3)


def test_drawn_cases_pass_the_harness(gpu_check):
    from sweeps.gemm import bf16_grouped_strategy, bf16_strategy
    from sweeps.common import draw

    for params in draw(bf16_strategy(), 12, 7) + draw(bf16_grouped_strategy(), 6, 7):
        gpu_check(Case("gemm", params))


# ---------------- the served ops, on their kernels ----------------

@functools.cache
def _served(op: str):
    from dsv4bench.model.kernel_ops import served_ops

    return served_ops()[op]


@pytest.mark.parametrize("widths,tokens", [(bc.SMALL, 1), (bc.SMALL, 130), (bc.FLASH, 1), (bc.FLASH, 64),
                                           (bc.PRO, 8), (bc.PRO, 256)],
                         ids=["small-1", "small-130", "flash-1", "flash-64", "pro-8", "pro-256"])
def test_served_lm_head(widths, tokens):
    args = bc.op_args("lm_head", widths, tokens, seed=tokens, device="cuda")
    out = _served("lm_head")(*args)
    assert out.shape == (tokens, widths.vocab) and out.device.type == "cuda"
    bc.assert_passes("lm_head", out, args)


@pytest.mark.parametrize("compressor", sorted(bc.COMPRESSORS))
@pytest.mark.parametrize("widths,tokens,start", [(bc.SMALL, 1, 9), (bc.FLASH, 4, 4093), (bc.FLASH, 4096, 0),
                                                 (bc.PRO, 256, 1000), (bc.PRO, 1000, 0)],
                         ids=["small-1", "flash-4", "flash-4096", "pro-256", "pro-1000"])
def test_served_compressor_project(compressor, widths, tokens, start):
    args = bc.op_args("compressor_project", widths, tokens, seed=tokens, device="cuda", compressor=compressor,
                      start=start)
    out = _served("compressor_project")(*args)
    bc.assert_passes("compressor_project", out, args)
    bc.assert_summation_order_close("compressor_project", out, args)


@pytest.mark.parametrize("widths,tokens", [(bc.SMALL, 3), (bc.FLASH, 1), (bc.FLASH, 4097), (bc.PRO, 64)],
                         ids=["small-3", "flash-1", "flash-4097", "pro-64"])
def test_served_indexer_weights(widths, tokens):
    args = bc.op_args("indexer_weights", widths, tokens, seed=tokens, device="cuda")
    out = _served("indexer_weights")(*args)
    bc.assert_passes("indexer_weights", out, args)
    bc.assert_summation_order_close("indexer_weights", out, args)
