"""The model op this family's kernel serves (Family.serves; dsv4bench/model/kernel_ops.py):
`sparse_attention`, the gathered-key attention with a per-head sink over one MQA latent pool
(oracles/fmha.py; the model calls it once for all B·S query tokens, `oracles/model.py` `_one_pool`).
The kernel reads bf16 queries and keys and writes bf16 output (its low-precision reference is the
same math in bf16); the op's fp32 operands are rounded to bf16 on the way in."""

from __future__ import annotations

import math

import torch

from dsv4bench.core.registry import Unsupported


def case_params(s_q: int, h: int, d: int, s_kv: int, n: int, sink: bool) -> dict:
    """The fmha case of one call: b = 1, one kv head shared by every query head (MQA), K = V."""
    return {"mask": "sparse", "hd": d, "b": 1, "h_q": h, "h_kv": 1, "s_q": s_q, "s_kv": s_kv, "topk": n,
            "window": 0, "select": "random", "invalid": 0.0, "kv_layout": "shared", "sink": sink,
            "kv_shared": True, "lse": True}


def sparse_attention(run, q, kv, indices, sink, scale: float, v=None):
    """The model's `sparse_attention`: (out fp32 [s_q, h, d], lse fp32 [s_q, h]). q [s_q, h, d], kv
    [s_kv, d], indices [s_q, n] (-1 or out of range: no key), sink [h] or None."""
    s_q, h, d = q.shape
    if v is not None:
        raise Unsupported("sparse_attention: the kernel serves the MQA latent (values = keys), not separate values")
    if not math.isclose(scale, d ** -0.5, rel_tol=1e-6):
        raise Unsupported(f"sparse_attention: the kernel's softmax scale is d^-0.5 = {d ** -0.5:.6g}, got {scale:.6g}")
    inputs = {"q": q.to(torch.bfloat16).unsqueeze(0).contiguous(),
              "k": kv.to(torch.bfloat16).reshape(1, kv.shape[0], 1, d).contiguous(),
              "idx": indices.to(torch.int32).unsqueeze(0).contiguous()}
    if sink is not None:
        inputs["sink"] = sink.float().contiguous()
    out = run(case_params(s_q, h, d, kv.shape[0], indices.shape[1], sink is not None), inputs)
    return out["out"][0].float(), out["lse"][0]


OPS = {"sparse_attention": sparse_attention}
