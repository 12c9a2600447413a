"""The low-precision torch model: every op that has a `_lowprec` reference registered as backend
"lowprec" (`run-model --backend lowprec`). Those references are the per-op rules the kernels are
judged by (FP8 activation quantisation before every FP8 / FP4 GEMM as the official inference does,
bf16 where the kernels compute in bf16, fp32 accumulation), so this model is issue 24's
low-precision baseline: its `--compare` against FP32 states the error a correct kernel model may
reach, and it is the torch path the kernel model's speed is measured against.

A bf16 model, as the official inference runs: `select_all("lowprec")` sets the table's residual
streams to bf16 (STREAM_DTYPES), and the references of the memory-bound ops (norms, mHC, attention,
the heads) compute in their input's dtype, so activations stay bf16 between ops; the GEMMs quantise
their activations to FP8. Ops without a low-precision form (embed, the compressor's fp32 projections
and state push, the index selections, the sampler) keep their FP32 oracle, as the reference keeps
those in fp32 or exact. A width the 128-wide activation blocks do not divide (the tiny model's 64)
is refused (`Unsupported`): that call runs on the oracle and the ops table counts it."""

from __future__ import annotations

import functools

import torch

from dsv4bench.core.registry import Unsupported
from oracles.attention import output_projection_lowprec
from oracles.compressor import CSA_RATIO, block_candidates, pool, postprocess_lowprec
from oracles.fmha import sparse_attention_lowprec
from oracles.head import lm_logits_lowprec, mtp_input_lowprec
from oracles.indexer import indexer_queries_lowprec, indexer_scores_lowprec, indexer_weights_lowprec
from oracles.mhc import hc_post_lowprec, hc_pre_lowprec
from oracles.norm import NORM_EPS
from oracles.moe import moe_lowprec
from oracles.norm import rmsnorm_lowprec
from oracles.projections import kv_projection_lowprec, q_projection_lowprec
from oracles.quant import BlockSizeError

LOWPREC = "lowprec"


def indexer_scores_bf16(q, k, weights, positions, m: int = CSA_RATIO):
    """`indexer_scores_lowprec` on the model's operands, whatever their dtype: the reference takes its
    einsum operands in bf16 (the model's indexer key cache is fp32)."""
    return indexer_scores_lowprec(q.bfloat16(), k.bfloat16(), weights.bfloat16(), positions, m)


def compressor_prefill_lowprec(kv, score, norm_weight, m: int, freqs, indexer: bool = False, qat: bool = True,
                               eps: float = NORM_EPS):
    """The reference's prefill compressor: pooling in fp32 (its kv/score state is fp32), then the bf16
    post-processing of §5.5."""
    raw = pool(*block_candidates(kv, score, m))
    ids = torch.arange(raw.shape[1], device=raw.device).repeat(raw.shape[0])
    out = postprocess_lowprec(raw.flatten(0, 1), norm_weight, ids, m, freqs, indexer=indexer, qat=qat, eps=eps)
    return out.unflatten(0, raw.shape[:2])


OPS = {
    "hc_pre": hc_pre_lowprec,
    "rmsnorm": rmsnorm_lowprec,
    "q_projection": q_projection_lowprec,
    "kv_projection": kv_projection_lowprec,
    "compressor_prefill": compressor_prefill_lowprec,
    "compressor_post": postprocess_lowprec,
    "indexer_queries": indexer_queries_lowprec,
    "indexer_weights": indexer_weights_lowprec,
    "indexer_scores": indexer_scores_bf16,
    "sparse_attention": sparse_attention_lowprec,
    "output_projection": output_projection_lowprec,
    "hc_post": hc_post_lowprec,
    "moe": moe_lowprec,
    "mtp_input": mtp_input_lowprec,
    "lm_head": lm_logits_lowprec,
}


def _refusing(op: str, fn):
    """`fn`, with a width its quantisation blocks do not divide refused instead of failing the run."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BlockSizeError as e:
            raise Unsupported(f"{op}: the low-precision reference's quantisation blocks do not fit: {e}") from e

    return call


def register_lowprec_ops() -> dict[str, str]:
    """Register every op's low-precision reference as backend "lowprec"; op -> the function."""
    from dsv4bench.model.dispatch import STREAM_DTYPES, register_op

    STREAM_DTYPES[LOWPREC] = torch.bfloat16
    for op, fn in OPS.items():
        register_op(op, LOWPREC, _refusing(op, fn))
    return {op: f"{fn.__module__}.{fn.__name__}" for op, fn in OPS.items()}
