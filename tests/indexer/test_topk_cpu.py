"""The indexer top-k on the CPU: a fresh sm_90a compile of the kernel from fake tensors (no local
memory), the argument checks (one ValueError naming the argument), the output width, and a torch model
of the kernel's algorithm (the order key, the three radix passes with the kernel's digits, the
take-all rule, the gather's slot formula) against oracles/indexer.py `indexer_topk` as index sets, on
the shapes the GPU tests run."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.compare import compare_index_sets
from kernels.indexer import topk_sm90 as K
from kernels.indexer.topk_glue import check_topk_args, compile_topk, out_width, topk_indices
from oracles.indexer import indexer_topk


# ---------------- a model of the kernel's algorithm ----------------

def order_key(x: torch.Tensor) -> torch.Tensor:
    """topk_sm90.order_key in int64: bits, or -(bits & 0x7fffffff) for a set sign bit."""
    b = x.float().contiguous().view(torch.int32).long()
    return torch.where(b < 0, -(b & 0x7FFFFFFF), b)


def model_row(x: torch.Tensor, k: int) -> torch.Tensor:
    """What the kernel writes for one row (int64 [min(k, S)])."""
    n = x.shape[0]
    kk = out_width(n, k)
    key = order_key(x)
    u = (key ^ K.SIGN) & 0xFFFFFFFF  # the unsigned pattern (int64 holds it without a sign)
    valid = key > K.NEG_INF_KEY
    prefix, remaining, take_all, n_sel = 0, kk, False, kk
    for p, (shift, width) in enumerate(K.DIGITS):
        hi_mask = K._s32(~((1 << (shift + width)) - 1)) & 0xFFFFFFFF
        match = valid & ((u & hi_mask) == prefix)
        hist = torch.bincount(((u[match] >> shift) & ((1 << width) - 1)), minlength=1 << width)
        total = int(hist.sum())
        if p == 0 and total <= remaining:
            take_all, n_sel = True, total
            break
        above = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0]) - hist  # entries in higher bins
        hit = (above < remaining) & (above + hist >= remaining)
        assert int(hit.sum()) == 1  # exactly one thread writes the state
        b = int(torch.nonzero(hit)[0])
        prefix |= b << shift
        remaining -= int(above[b])
    thr, need = (K.NEG_INF_KEY, 0) if take_all else (K._s32(prefix ^ 0x80000000), remaining)
    gt, eq = key > thr, key == thr
    gt_before = torch.cumsum(gt.long(), 0) - gt.long()
    eq_before = torch.cumsum(eq.long(), 0) - eq.long()
    out = torch.full((kk,), -99, dtype=torch.long)
    idx = torch.arange(n)
    slot_gt = gt_before + torch.clamp(eq_before, max=need)
    out[slot_gt[gt]] = idx[gt]
    take_eq = eq & (eq_before < need)
    out[(gt_before + eq_before)[take_eq]] = idx[take_eq]
    assert int(gt.sum()) + int(take_eq.sum()) == n_sel  # the gather fills exactly the counted slots
    out[n_sel:] = -1
    assert not (out == -99).any()
    return out


def model(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.stack([model_row(r, k) for r in x]) if x.shape[0] else torch.empty(0, out_width(x.shape[1], k))


def _check(x: torch.Tensor, k: int):
    got = model(x, k)
    m = compare_index_sets(got, indexer_topk(x, k))
    assert m.passed, m.reasons
    valid = got >= 0
    big = torch.where(valid, got, torch.full_like(got, 2**40))
    assert (big[:, 1:] >= big[:, :-1]).all()  # ascending indices, then the -1 slots


def test_order_key_is_monotone_and_merges_signed_zeros():
    vals = torch.tensor([float("-inf"), -3e38, -1.0, -1e-42, -0.0, 0.0, 1e-42, 1.0, 3e38, float("inf")])
    key = order_key(vals)
    assert (key[1:] >= key[:-1]).all() and int(key[4]) == int(key[5]) == 0
    assert int(key[0]) == K.NEG_INF_KEY and int(key.min()) >= -(2**31 - 1) and int(key.max()) <= 2**31 - 1
    u = (key ^ K.SIGN) & 0xFFFFFFFF
    assert (u[1:] >= u[:-1]).all()
    r = torch.randn(10000)
    kr = order_key(r)
    assert torch.equal(torch.argsort(kr, stable=True), torch.argsort(r, stable=True))


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [1, 100, 511, 512, 513, 4096, 65536, 262144])
def test_model_random_rows(n, k):
    g = torch.Generator().manual_seed(n + k)
    _check(torch.randn(2, n, generator=g), k)


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [1, 513, 4096, 262144])
def test_model_ties(n, k):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, generator=g).bfloat16().float()  # many exact ties at the threshold
    x[1] = 0.25  # all equal
    x[2, : n // 2] = 0.0
    x[2, n // 2:] = -0.0  # signed zeros tie (the oracle's sort holds them equal)
    _check(x, k)


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [100, 513, 4096, 65536])
def test_model_masked_tails_and_fewer_than_k(n, k):
    g = torch.Generator().manual_seed(3 * n)
    lens = sorted({v for v in (0, 1, k - 1, k, k + 1, n // 2, n - 1, n) if 0 <= v <= n})
    x = torch.randn(len(lens), n, generator=g)
    for r, v in enumerate(lens):
        x[r, v:] = float("-inf")
    x[0, :] = float("-inf")
    _check(x, k)
    y = torch.full((2, n), float("-inf"))
    keep = torch.randperm(n, generator=g)[: min(17, n)]
    y[1, keep] = torch.randn(keep.numel(), generator=g)
    _check(y, k)


def test_model_special_values():
    x = torch.randn(1, 3000, generator=torch.Generator().manual_seed(1))
    x[0, ::3], x[0, 1::3] = 1e-42, -1e-42
    x[0, 5], x[0, 6], x[0, 7] = 3e38, -3e38, float("inf")
    _check(x, 512)


# ---------------- compile, checks ----------------

def test_compiles_for_sm90a_without_local_memory():
    from dsv4bench.compile.artifacts import artifact
    from dsv4bench.compile.cubin import parse_cubin

    info = parse_cubin(artifact(compile_topk("sm_90a")))
    assert info.local_bytes == 0, f"{info.local_bytes} B of local memory (spills)"
    assert info.sm == 90


def test_out_width_is_the_oracles():
    for n, k in ((1, 512), (511, 512), (512, 512), (513, 512), (262144, 1024), (1000, 1024)):
        assert out_width(n, k) == indexer_topk(torch.zeros(1, n), k).shape[-1]


@pytest.mark.parametrize("logits,k,out,name", [
    ([[1.0]], 4, None, "logits"),
    (torch.zeros(3), 4, None, "logits"),
    (torch.zeros(2, 3, 4), 4, None, "logits"),
    (torch.zeros(2, 8, dtype=torch.float16), 4, None, "logits"),
    (torch.zeros(8, 2).t(), 4, None, "logits"),
    (torch.zeros(2, 8), 0, None, "k"),
    (torch.zeros(2, 8), 4.0, None, "k"),
    (torch.zeros(2, 8), True, None, "k"),
    (torch.zeros(2, 8), 4, torch.zeros(2, 4, dtype=torch.int64), "out"),
    (torch.zeros(2, 8), 4, torch.zeros(2, 8, dtype=torch.int32), "out"),
    (torch.zeros(2, 8), 16, torch.zeros(2, 16, dtype=torch.int32), "out"),
    (torch.zeros(2, 8), 4, torch.zeros(4, 2, dtype=torch.int32).t(), "out"),
])
def test_bad_arguments_raise_value_error_naming_them(logits, k, out, name):
    with pytest.raises(ValueError, match=rf"indexer top-k: {name} "):
        check_topk_args(logits, k, out)


def test_good_arguments_and_cpu_tensors():
    assert check_topk_args(torch.zeros(3, 700), 512) == (3, 700, 512)
    assert check_topk_args(torch.zeros(3, 100), 1024, torch.zeros(3, 100, dtype=torch.int32)) == (3, 100, 100)
    assert check_topk_args(torch.zeros(8, 1)[:, :1].t().t(), 512) == (8, 1, 1)
    with pytest.raises(ValueError, match="logits must be on a CUDA device"):
        topk_indices(torch.zeros(2, 8), 4)
