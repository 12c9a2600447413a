"""The ops served beyond the projections on their kernels (the H100), at the Flash widths and the
model's own shapes: indexer_queries (64 heads x 128 over q_lora 1024), mtp_input (4 streams of 4096),
compressor_prefill (CSA and HCA entries of 512, batches of ragged prefills) against their FP32
oracles by the FP8 rule (tests/gemm/served_checks.py), and sample over the 129,280-token vocabulary:
the oracle's tokens exactly, from the same seeded CPU noise."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from dsv4bench.core.registry import Unsupported
from dsv4bench.model.dispatch import OPS
from dsv4bench.model.kernel_ops import served_ops
from tests.gemm import served_checks as sc
from tests.model import served_args as sa

pytestmark = pytest.mark.gpu


@functools.cache
def _served(op: str):
    return served_ops()[op]  # the KernelOp the model registers (its compile cache kept across tests)


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return seed


@pytest.mark.parametrize("tokens", [1, 5, 301, 4096])
def test_indexer_queries(tokens, monkeypatch):
    args, kwargs = sa.op_args("indexer_queries", sa.FLASH, tokens, seed=_seed(), device="cuda")
    sa.assert_passes("indexer_queries", _served("indexer_queries")(*args, **kwargs), args, kwargs, monkeypatch)


@pytest.mark.parametrize("tokens", [1, 7, 129])
def test_mtp_input(tokens, monkeypatch):
    args, kwargs = sa.op_args("mtp_input", sa.FLASH, tokens, seed=_seed(), device="cuda")
    sa.assert_passes("mtp_input", _served("mtp_input")(*args, **kwargs), args, kwargs, monkeypatch)


@pytest.mark.parametrize("ratio,tokens,batch", [(4, 4, 1), (4, 4096 + 3, 1), (4, 1000, 3), (128, 128, 1),
                                                (128, 4096 + 77, 2)])
def test_compressor_prefill(ratio, tokens, batch, monkeypatch):
    args, kwargs = sa.op_args("compressor_prefill", sa.FLASH, tokens, seed=_seed(), device="cuda", batch=batch,
                              ratio=ratio)
    sa.assert_passes("compressor_prefill", _served("compressor_prefill")(*args, **kwargs), args, kwargs, monkeypatch)


def test_a_prefill_shorter_than_a_block_has_no_entries():
    """3 tokens at m = 4: nothing to compress, no launch (the kernel takes >= 1 entry; 6751038)."""
    args, kwargs = sa.op_args("compressor_prefill", sa.FLASH, 3, seed=1, device="cuda")
    out = _served("compressor_prefill")(*args, **kwargs)
    assert out.shape == (1, 0, sa.ENTRY) and out.dtype == torch.float32


@pytest.mark.parametrize("batch,seqlen,n,start", [(1, 4096, 1024, 0), (1, 1, 2048, 8300), (4, 1, 700, 3000),
                                                  (2, 301, 75, 0)])
def test_indexer_scores(batch, seqlen, n, start):
    q, k, w = sa.indexer_operands(batch, seqlen, n, _seed(), "cuda")
    positions = torch.arange(start, start + seqlen, device="cuda")
    out = _served("indexer_scores")(q, k, w, positions)
    want = OPS["indexer_scores"].oracle(q, k, w, positions)
    seen = torch.isfinite(want)
    assert torch.equal(seen, torch.isfinite(out)) and torch.equal(out[~seen], want[~seen])  # the causal mask
    low = sa.LOWPREC["indexer_scores"](q, k, w, positions)
    o, r, lp = (t[seen].double().cpu() for t in (out, want, low))
    row = {"finite": True, "max": float((o - r).abs().max()), "low_max": float((lp - r).abs().max()),
           "rel": float((o - r).norm() / r.norm()), "low_rel": float((lp - r).norm() / r.norm()),
           "ulp": 2.0 ** (math.floor(math.log2(float(r.abs().max()))) - 7)}
    assert sc.passes(row), row  # the FP8 rule on the visible entries


def test_indexer_scores_refuse_fp32_queries():
    q, k, w = sa.indexer_operands(1, 3, 16, 1, "cuda")
    with pytest.raises(Unsupported, match="queries"):
        _served("indexer_scores")(torch.randn_like(q), k, w, torch.arange(60, 63, device="cuda"))


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("rows", [1, 4])
def test_sample_gives_the_oracles_tokens(temperature, rows):
    logits = sa.sample_args(rows, sa.FLASH.vocab, seed=_seed(), device="cuda")
    for _ in range(5):
        seed = random.randrange(1 << 30)
        got = _served("sample")(logits, temperature, torch.Generator().manual_seed(seed))
        want = OPS["sample"].oracle(logits, temperature, torch.Generator().manual_seed(seed))
        assert got.device.type == "cuda" and torch.equal(got.cpu(), want), (seed, got, want)
