"""The indexer family's top-k op on the GPU: every production case (Flash / Pro prefill and decode to
1M tokens of context) and hypothesis draws through the harness's evaluation path (poisoned outputs,
canaries, index sets against oracles/indexer.py `indexer_topk`), the torch.topk peer on the same
cases (CUDA's torch.topk takes tied entries in index order, as the oracle), and the model op
`indexer_topk` served by the kernel against its oracle."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.compare import compare_index_sets
from dsv4bench.core.registry import SweepOptions, Unsupported, get_family, get_impl
from dsv4bench.model.kernel_ops import served_ops
from oracles.indexer import causal_entry_mask, indexer_topk

pytestmark = pytest.mark.gpu

FAMILY = get_family("indexer")
CASES = FAMILY.cases(SweepOptions(examples=40, seed=5, filters={"op": ["topk"]}))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_on_the_family_cases(case, gpu_check):
    gpu_check(case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_topk_peer_on_the_family_cases(case, gpu_check):
    gpu_check(case, get_impl("indexer", "torch"))


def _model_scores(batch: int, tokens: int, entries: int, p0: int, dtype=torch.float32) -> torch.Tensor:
    """Scores as the model's indexer_scores makes them: [B, S, N], -inf past each query's causal entries."""
    scores = torch.randn(batch, tokens, entries, device="cuda").to(dtype)
    visible = causal_entry_mask(torch.arange(p0, p0 + tokens, device="cuda"), entries)
    return scores.masked_fill(~visible, float("-inf"))


@pytest.mark.parametrize("batch, tokens, entries, p0, topk", [
    (2, 37, 9, 0, 8),          # the tiny model's prefill: fewer entries than k
    (1, 4096, 1024, 0, 1024),  # Pro prefill at S = 4096
    (1, 4100, 1025, 0, 512),   # Flash prefill, last rows past k
    (3, 1, 70000, 279999, 512),  # decode, one token per sequence
    (1, 5, 0, 0, 8),           # no entry yet
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_served_op_matches_its_oracle(batch, tokens, entries, p0, topk, dtype):
    op = served_ops()["indexer_topk"]
    scores = _model_scores(batch, tokens, entries, p0, dtype)
    got, ref = op(scores, topk), indexer_topk(scores.float(), topk)
    assert got.dtype == torch.int64 and got.shape == ref.shape and got.device == scores.device
    m = compare_index_sets(got.cpu(), ref.cpu())
    assert m.passed, m.reasons


def test_served_op_refuses_scores_off_the_gpu():
    with pytest.raises(Unsupported, match="indexer_topk: the indexer kernel takes CUDA tensors, got cpu"):
        served_ops()["indexer_topk"](torch.zeros(1, 4, 16), 8)
