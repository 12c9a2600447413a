"""The model op this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py): the top-k
selection. The logits kernel does not serve `indexer_scores`: that op takes fp32 queries and keys
(any values: with QAT off they are not FP4-simulated) of any head count (the tiny model has 16); the
kernel takes FP8 e4m3 queries and keys (one fp32 scale per key) of 64 heads, so an adapter would
round the op's inputs, which is not the oracle's contract."""

from __future__ import annotations

import math

import torch

from dsv4bench.core.registry import Unsupported
from kernels.indexer.topk_glue import check_topk_args

EXACT_IN_FP32 = (torch.float32, torch.bfloat16, torch.float16)  # scores the kernel ranks as given


def indexer_topk(run, scores: torch.Tensor, topk: int) -> torch.Tensor:
    """The model's `indexer_topk` op on the top-k kernel: scores [..., N] (-inf = not visible) ->
    int64 [..., min(topk, N)], -1 = none. Each row holds the oracle's set (ties to the lower index),
    listed in ascending index order rather than by score: the op's output is a set (oracles/indexer.py)."""
    if scores.dtype not in EXACT_IN_FP32:
        raise Unsupported(f"indexer_topk: the kernel ranks float32 scores; {scores.dtype} would be rounded")
    rows = scores.reshape(math.prod(scores.shape[:-1]), scores.shape[-1]).float().contiguous()
    n_rows, n, width = check_topk_args(rows, topk)
    out = run({"op": "topk", "t": n_rows, "s_kv": n, "k": topk}, {"logits": rows})
    return out["indices"].long().reshape(*scores.shape[:-1], width)


OPS = {"indexer_topk": indexer_topk}
