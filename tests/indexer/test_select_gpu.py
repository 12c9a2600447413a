"""The fused decode top-k (kernels/indexer/select_glue.py) on the H100. Every call must give the
unfused pair's answer exactly (the paged decode kernel's logits, then the top-k kernel: the same
indices in the same order, ties to the lower index, -1 slots), and the oracle's set up to near-ties.
Covered: requests of 0 .. CAP keys (no bound), past CAP (sampled bound, buffers), lengths around k,
all-equal keys (every long request overflows its buffers: the repair), a cache built against the
sample (too few survivors: the repair), a k past CAP / 4 (the unfused route), shared tables, B up to
130 and a 262,144-key request split over ~500 CTAs. Where the test knows which requests must take the
repair it asserts that from the counts workspace, so the repair path is known to have run."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.compare import compare_index_sets
from kernels.indexer.decode_glue import cache_views, decode_reference, make_decode_inputs, run_decode
from kernels.indexer.select_glue import compile_select, paged_topk, repaired, select
from kernels.indexer.select_sm90 import SAMPLE_PAGES
from kernels.indexer.topk_glue import run_topk
from kernels.indexer.topk_select import CAP
from oracles.indexer import indexer_topk

pytestmark = pytest.mark.gpu

_COMPILED: list = []


def _compiled():
    if not _COMPILED:
        _COMPILED.append(compile_select())
    return _COMPILED[0]


def _unfused(x, width, kk):
    logits = torch.empty(x["q"].shape[0], width, device="cuda")
    run_decode(_compiled().decode, **x, out=logits)
    out = torch.empty(x["q"].shape[0], kk, dtype=torch.int32, device="cuda")
    run_topk(_compiled().topk, logits, out)
    return out


def _check(lens, width, k, table="shuffled", keys="randn", seed=0, x=None, expect_repair=None):
    x = x or make_decode_inputs(lens, width, table, seed, "cuda", keys=keys)
    kk = min(k, width)
    what = f"B={len(lens)} W={width} k={k} lens={lens[:6]}{'...' if len(lens) > 6 else ''} {table} {keys}"
    out = torch.full((len(lens), kk), -7, dtype=torch.int32, device="cuda")
    trace: dict = {}
    select(_compiled(), **x, width=width, out=out, fused=True, trace=trace)
    pair = _unfused(x, width, kk)
    torch.cuda.synchronize()
    diff = (out != pair).any(dim=1).nonzero().flatten().tolist()
    assert not diff, f"{what}: rows {diff[:6]} differ from the unfused pair (first: {out[diff[0], :8].tolist()} vs " \
                     f"{pair[diff[0], :8].tolist()})"
    ref = decode_reference(**x, width=width)
    low = decode_reference(**x, width=width, lowprec=True)
    m = compare_index_sets(out, indexer_topk(ref, k).to(torch.int32), ref, low, 2.0)
    assert m.passed, f"{what}: {m.reasons}"
    if expect_repair is not None:
        assert "counts" in trace, f"{what}: took the unfused route"
        assert repaired(trace["counts"], kk).tolist() == expect_repair, what
    return out, x


EDGES = [0, 1, 63, 64, 65, 511, 512, 513, 1000, CAP - 1, CAP]


@pytest.mark.parametrize("k", [1, 100, 512, 1024])
def test_requests_up_to_cap_keep_every_valid_key(k):
    _check(EDGES, CAP, k, expect_repair=[False] * len(EDGES))


@pytest.mark.parametrize("k", [512, 1024])
def test_long_requests_take_the_sampled_bound(k):
    lens = [20000, CAP + 1, 0, 15000, 511, 9000, 19999]
    _check(lens, 20000, k, expect_repair=[False] * len(lens))


def test_all_equal_keys_overflow_and_are_repaired():
    """One key everywhere: every logit of a request is equal; past CAP keys the buffers overflow."""
    lens = [20000, 100, 9000, CAP, CAP + 1]
    _check(lens, 20000, 512, keys="equal", expect_repair=[n > CAP for n in lens])


def test_a_cache_built_against_the_sample_is_repaired():
    """Request 0's sampled pages get 64x larger key scales: its bound lands among them and too few
    of its keys survive (fewer than k); request 1 is untouched."""
    width = 40000
    x = make_decode_inputs([width, width], width, seed=3, device="cuda")
    full_pages = width // 64
    cols = [(i * full_pages) // SAMPLE_PAGES for i in range(SAMPLE_PAGES)]
    pages = x["table"][0, cols].long()
    _, scales = cache_views(x["kv_cache"])
    scales[pages] *= 64
    _check([width, width], width, 1024, x=x, expect_repair=[True, False])


def test_k_past_a_quarter_of_the_buffer_takes_the_unfused_route():
    out, _ = _check([20000, 3000], 20000, CAP // 4 + 1)
    assert (out[1, 3000:] == -1).all() and (out[1, :3000] >= 0).all()


def test_shared_tables_and_a_ragged_batch_of_130():
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 12000, (130,), generator=g).tolist()
    _check(lens, 12000, 100, table="shared", seed=5)


def test_one_long_request_over_many_ctas():
    """1M tokens of context: 262,144 keys, split over ~500 CTAs (the finish's chunk search)."""
    _check([262144], 262144, 1024, expect_repair=[False])


def test_a_batch_at_production_width():
    _check([65536] * 32, 65536, 512, expect_repair=[False] * 32)


def test_the_op_picks_its_route_and_both_give_the_pairs_answer():
    """paged_topk runs the fused kernels only where config.fuse_select says they win (B >= 8 past
    131,072 entries); B = 8 at 140,000 takes them, B = 7 the pair: both equal the pair."""
    for n_req in (7, 8):
        x = make_decode_inputs([140000] * n_req, 140000, seed=n_req, device="cuda")
        got = paged_topk(**x, width=140000, k=1024)
        assert torch.equal(got, _unfused(x, 140000, 1024)), n_req

