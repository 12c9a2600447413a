"""The indexer top-k on the CPU: a fresh sm_90a compile of the kernel from fake tensors (no local
memory), the argument checks (one ValueError naming the argument), the output width, and a torch model
of the kernel's algorithm (the order key, the three radix passes with the kernel's digits, the
take-all rule, the gather's slot formula) against oracles/indexer.py `indexer_topk` as index sets, on
the shapes the GPU tests run."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.compare import compare_index_sets
from kernels.indexer import topk_select as K
from kernels.indexer.topk_glue import check_topk_args, compile_topk, out_width, topk_indices
from oracles.indexer import indexer_topk


# ---------------- a model of the kernel's algorithm ----------------

def order_key(x: torch.Tensor) -> torch.Tensor:
    """topk_sm90.order_key in int64: bits, or -(bits & 0x7fffffff) for a set sign bit."""
    b = x.float().contiguous().view(torch.int32).long()
    return torch.where(b < 0, -(b & 0x7FFFFFFF), b)


def radix_select(key: torch.Tensor, kk: int) -> tuple[int, int, int]:
    """The kernel's radix_select on order keys (int64 [n]): (threshold key, ties taken, selected)."""
    u = (key ^ K.SIGN) & 0xFFFFFFFF  # the unsigned pattern (int64 holds it without a sign)
    valid = key > K.NEG_INF_KEY
    prefix, remaining = 0, kk
    for p, (shift, width) in enumerate(K.DIGITS):
        hi_mask = K._s32(~((1 << (shift + width)) - 1)) & 0xFFFFFFFF
        match = valid & ((u & hi_mask) == prefix)
        hist = torch.bincount(((u[match] >> shift) & ((1 << width) - 1)), minlength=1 << width)
        total = int(hist.sum())
        if p == 0 and total <= remaining:
            return K.NEG_INF_KEY, 0, total
        above = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0]) - hist  # entries in higher bins
        hit = (above < remaining) & (above + hist >= remaining)
        assert int(hit.sum()) == 1  # exactly one thread writes the state
        b = int(torch.nonzero(hit)[0])
        prefix |= b << shift
        remaining -= int(above[b])
    return K._s32(prefix ^ 0x80000000), remaining, kk


def gather(key: torch.Tensor, idx: torch.Tensor, kk: int, thr: int, need: int, n_sel: int) -> torch.Tensor:
    """The kernel's gather and -1 fill over a source of (key, index) in index order."""
    gt, eq = key > thr, key == thr
    gt_before = torch.cumsum(gt.long(), 0) - gt.long()
    eq_before = torch.cumsum(eq.long(), 0) - eq.long()
    out = torch.full((kk,), -99, dtype=torch.long)
    slot_gt = gt_before + torch.clamp(eq_before, max=need)
    out[slot_gt[gt]] = idx[gt]
    take_eq = eq & (eq_before < need)
    out[(gt_before + eq_before)[take_eq]] = idx[take_eq]
    assert int(gt.sum()) + int(take_eq.sum()) == n_sel  # the gather fills exactly the counted slots
    out[n_sel:] = -1
    assert not (out == -99).any()
    return out


def fast_source(key: torch.Tensor, kk: int):
    """The fast path's buffer (keys, indices) for a row, or None where the kernel falls back."""
    n = key.shape[0]
    if not K.fast_path_possible(kk):
        return None
    key_lo = K.LOWEST_VALID
    if n > K.CAP:
        sample = key[torch.arange(K.SAMPLE) * (n // K.SAMPLE)]
        thr, _, _ = radix_select(sample, K.sample_rank(kk, n))
        key_lo = K.LOWEST_VALID if thr == K.NEG_INF_KEY else thr
    sel = key >= key_lo
    count = int(sel.sum())
    if count > K.CAP or (count < kk and key_lo != K.LOWEST_VALID):
        return None
    return key[sel], torch.nonzero(sel).flatten()


def model_row(x: torch.Tensor, k: int, paths: list | None = None) -> torch.Tensor:
    """What the kernel writes for one row (int64 [min(k, S)]); appends the path taken to paths: "direct"
    (rows of at most CAP entries: the unbuffered compile), "fast" or "fallback" (the buffered one)."""
    n = x.shape[0]
    kk = out_width(n, k)
    key = order_key(x)
    src = fast_source(key, kk) if n > K.CAP else None
    if paths is not None:
        paths.append("direct" if n <= K.CAP else "fallback" if src is None else "fast")
    keys, idx = (key, torch.arange(n)) if src is None else src
    return gather(keys, idx, kk, *radix_select(keys, kk))


def model(x: torch.Tensor, k: int, paths: list | None = None) -> torch.Tensor:
    if not x.shape[0]:
        return torch.empty(0, out_width(x.shape[1], k))
    return torch.stack([model_row(r, k, paths) for r in x])


def _check(x: torch.Tensor, k: int, paths: list | None = None):
    got = model(x, k, paths)
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
    paths = []
    _check(torch.randn(2, n, generator=g), k, paths)
    assert paths == ["direct" if n <= K.CAP else "fast"] * 2  # long rows: one read


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [8193, 16384, 65536, 262144])
def test_model_score_like_rows_take_the_fast_path(n, k):
    """Indexer scores are sums of w * ReLU(q . k): positive, clustered, many exact zeros; heavy-tailed
    and narrow rows too. The sampled bound must still land the buffer between KK and CAP entries."""
    g = torch.Generator().manual_seed(n * k)
    relu_sums = torch.relu(torch.randn(n, 64, generator=g)).sum(-1) * 0.01
    narrow = 1.0 + torch.rand(n, generator=g) * 1e-2  # one exponent, ~80,000 distinct values
    heavy = torch.exp(4 * torch.randn(n, generator=g))
    paths = []
    _check(torch.stack([relu_sums, narrow, heavy]), k, paths)
    assert paths == ["fast"] * 3


def test_model_adversarial_rows_fall_back_and_stay_exact():
    """Spikes exactly on the sample's stride (the bound lands too high: fewer than KK collected) and a
    row of one repeated value (the buffer overflows): both take the 4-read fallback, same answer."""
    n, k = 65536, 1024
    spikes = torch.rand(n)
    spikes[:: n // K.SAMPLE] = 10.0 + torch.arange(K.SAMPLE)
    paths = []
    _check(torch.stack([spikes, torch.full((n,), 0.25)]), k, paths)
    assert paths == ["fallback", "fallback"]


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

@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_compiles_without_local_memory(arch):
    """No wgmma or TMA in the top-k: every compile builds for Hopper and Blackwell (the B200 path is
    compile-checked only)."""
    from dsv4bench.compile.artifacts import artifact
    from dsv4bench.compile.cubin import parse_cubin

    compiled = compile_topk(arch)
    for name in compiled.names():
        info = parse_cubin(artifact(compiled.kernels[name]))
        assert info.local_bytes == 0, f"{name}: {info.local_bytes} B of local memory (spills)"
        assert info.sm == int(arch[3:-1])


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


def test_split_chunks_follow_the_measured_rule():
    from kernels.indexer.topk_glue import split_chunks

    assert [split_chunks(t, 262144, 132) for t in (1, 32, 64, 128, 4096)] == [16, 4, 2, 1, 1]
    assert [split_chunks(1, n, 132) for n in (8193, 16384, 16385, 65536)] == [1, 1, 2, 4]
    assert split_chunks(0, 262144, 132) == 16
