"""The indexer top-k kernel (kernels/indexer/topk_sm90.py) against oracles/indexer.py `indexer_topk` on
the GPU, as index sets (dsv4bench/core/compare.py `compare_index_sets`; the kernel breaks ties to the
lower index as the oracle does, so the sets are equal, not just equal up to ties): row lengths around
k and up to 262,144 entries, rows with fewer than k valid entries, all-equal rows, -inf masked tails,
heavy ties at the threshold, k 512 and 1024. Beyond the set: the output's order (ascending index, then
the -1 slots) and that every slot is written (the output is poisoned first)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.compare import compare_index_sets
from kernels.indexer.topk_glue import compile_topk, run_topk, topk_indices
from oracles.indexer import indexer_topk

pytestmark = pytest.mark.gpu

POISON = -7
LENGTHS = (1, 100, 511, 512, 513, 4096, 65536, 262144)
_COMPILED: dict = {}


def _run(x: torch.Tensor, k: int) -> torch.Tensor:
    if "c" not in _COMPILED:
        _COMPILED["c"] = compile_topk()
    out = torch.full((x.shape[0], min(k, x.shape[1])), POISON, dtype=torch.int32, device=x.device)
    run_topk(_COMPILED["c"], x, out)
    torch.cuda.synchronize()
    return out


def _check(x: torch.Tensor, k: int, out: torch.Tensor | None = None):
    out = _run(x, k) if out is None else out
    ref = indexer_topk(x.cpu(), k)
    got = out.cpu().long()
    assert not (got == POISON).any(), "unwritten output slots"
    m = compare_index_sets(got, ref)
    assert m.passed, m.reasons
    # order: ascending indices, then -1 slots
    valid = got >= 0
    n_valid = valid.sum(-1)
    assert torch.equal(n_valid, (ref >= 0).sum(-1))
    pos = torch.arange(got.shape[1]).expand_as(got)
    assert torch.equal(valid, pos < n_valid.unsqueeze(-1))
    big = torch.where(valid, got, torch.full_like(got, 2**40))
    assert (big[:, 1:] >= big[:, :-1]).all() if got.shape[1] > 1 else True
    return got


def _rand(t: int, n: int, seed: int, bf16: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, generator=g)
    if bf16:  # many exact ties
        x = x.bfloat16().float()
    return x.cuda()


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", LENGTHS)
def test_random_rows(n, k):
    t = 4 if n >= 65536 else 9
    _check(_rand(t, n, n + k), k)


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [1, 511, 513, 4096, 262144])
def test_bf16_rounded_rows_tie_at_the_threshold(n, k):
    _check(_rand(3, n, 7 * n + k, bf16=True), k)


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", LENGTHS)
def test_all_equal_rows(n, k):
    x = torch.full((3, n), 0.25, device="cuda")
    x[1] = 0.0  # ReLU-zeroed scores
    x[2] = -3.0
    got = _check(x, k)
    kk = min(k, n)
    assert torch.equal(got[0], torch.arange(kk))  # the lowest indices


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("n", [100, 513, 4096, 65536, 262144])
def test_masked_tails_causal(n, k):
    """Causal rows: row r sees a prefix whose length spans 0, < k, = k, > k and all of the row."""
    lens = sorted({0, 1, k - 1, k, k + 1, n // 2, n - 1, n})
    lens = [v for v in lens if 0 <= v <= n]
    x = _rand(len(lens), n, 3 * n + k)
    for r, v in enumerate(lens):
        x[r, v:] = float("-inf")
    _check(x, k)


@pytest.mark.parametrize("k", [512, 1024])
def test_fewer_valid_than_k_scattered(k):
    x = _rand(6, 4096, 11)
    g = torch.Generator().manual_seed(5)
    for r, n_valid in enumerate((0, 1, 17, k - 1, k, k + 1)):
        keep = torch.randperm(4096, generator=g)[:n_valid].cuda()
        mask = torch.ones(4096, dtype=torch.bool, device="cuda")
        mask[keep] = False
        x[r][mask] = float("-inf")
    _check(x, k)


def test_all_masked_rows():
    x = torch.full((4, 70000), float("-inf"), device="cuda")
    got = _check(x, 1024)
    assert (got == -1).all()


def test_special_values():
    """+inf, signed zeros (equal for the oracle's sort and for the kernel's key), huge and denormal
    magnitudes of both signs."""
    x = _rand(2, 3000, 1)
    x[0, 10] = float("inf")
    x[0, 20:600] = 0.0
    x[0, 600:900] = -0.0
    x[1, ::3] = 1e-42
    x[1, 1::3] = -1e-42
    x[1, 5] = 3e38
    x[1, 6] = -3e38
    _check(x, 512)
    _check(x, 1024)


def test_strided_rows_and_topk_indices_op():
    base = _rand(5, 5000, 3)
    x = base[:, 100:4200]  # row stride 5000, length 4100
    _check(x, 512)
    got = topk_indices(x, 1024)
    assert got.dtype == torch.int32 and got.shape == (5, 1024)
    assert compare_index_sets(got.cpu().long(), indexer_topk(x.cpu(), 1024)).passed


def test_many_short_rows_prefill_like():
    """A prefill's causal logits [T, T/4]: row t sees floor((t+1)/4) entries."""
    t = 4096
    n = t // 4
    x = _rand(t, n, 99)
    vis = (torch.arange(t, device="cuda") + 1) // 4
    x.masked_fill_(torch.arange(n, device="cuda") >= vis.unsqueeze(-1), float("-inf"))
    _check(x, 512)


@pytest.mark.parametrize("n", [4097, 8191, 8192, 8193, 10001, 65537, 262143])
def test_rows_not_16_byte_aligned_and_partial_steps(n):
    """Odd row lengths: contiguous rows start off 16 bytes (the scalar-load compile), the last collect
    step is partial, and 8192 / 8193 straddle the buffer's capacity (every entry vs a sampled bound)."""
    x = _rand(3, n, n)
    _check(x, 1024)
    _check(x[1:2, 1:], 512)  # one row, base 4 bytes past a 16-byte boundary


def test_score_like_and_adversarial_rows():
    """Rows like the logits kernel's (positive ReLU sums, many exact zeros), and rows built against the
    sampled bound (spikes on the sample's stride: the bound lands above the k-th largest) or with one
    repeated value (the buffer overflows): the fast path and both fallbacks give the oracle's set."""
    n, k = 65536, 1024
    g = torch.Generator().manual_seed(2)
    relu_sums = torch.relu(torch.randn(n, 64, generator=g)).sum(-1) * 0.01
    spikes = torch.rand(n, generator=g)
    spikes[:: n // 4096] = 10.0 + torch.arange(4096)
    x = torch.stack([relu_sums, spikes, torch.full((n,), 0.25), torch.randn(n, generator=g).clamp(min=0)])
    _check(x.cuda(), k)


@pytest.mark.parametrize("n", [700, 8192, 8193, 65536])
def test_every_compiled_kernel(n):
    """Each compile on rows the dispatch would not send it too: the buffered kernels on short rows
    (every valid entry buffered, no sample), the direct one on long rows, the scalar-load ones on
    aligned rows, the split form with 1, 3 and 40 chunks (chunks past the row's end stay empty)."""
    if "c" not in _COMPILED:
        _COMPILED["c"] = compile_topk()
    compiled = _COMPILED["c"]
    x = _rand(3, n, 5 * n)
    x[2, n // 3:] = float("-inf")
    for name in compiled.names():
        if name.endswith("-aligned") and not compiled.rows_aligned(x):
            continue  # refused by the call's checks (the stride must be a multiple of 4)
        for chunks in ((1, 3, 40) if name.startswith("split") else (1,)):
            out = torch.full((3, min(1024, n)), POISON, dtype=torch.int32, device="cuda")
            compiled.run(name, x, out, chunks)
            torch.cuda.synchronize()
            _check(x, 1024, out)


def test_dispatch():
    compiled = compile_topk() if "c" not in _COMPILED else _COMPILED["c"]
    x = torch.zeros(2, 262144, device="cuda")
    assert compiled.pick(x[:, :8192]) == ("direct", 1)
    assert compiled.pick(x)[0] == "split-aligned" and compiled.pick(x)[1] > 1
    assert compiled.pick(x[:, 1:])[0] == "split-unaligned"
    assert compiled.pick(torch.zeros(4096, 8196, device="cuda")) == ("rows-aligned", 1)
