"""Attention input projections (docs/model-math.md §4): q path and the single shared kv latent.

    qr = RMSNorm_{q_norm}(wq_a(x));  q = wq_b(qr).view(H, 512);  q = q·rsqrt(mean(q²)+eps) per head
    q[..., 448:] = RoPE_t(q[..., 448:])
    kv = RMSNorm_{kv_norm}(wkv(x));  kv[..., 448:] = RoPE_t(...);  kv[..., :448] = fp8_qdq(block 64)

Weights are `oracles.linear.Weight`s (plain tensors or checkpoint-format `QuantWeight`s).
`positions` holds each token's absolute position t, shaped like x.shape[:-1] (or broadcastable).
"""

from __future__ import annotations

import torch

from oracles.linear import Weight, linear, linear_lowprec
from oracles.norm import NORM_EPS, rmsnorm, rmsnorm_lowprec
from oracles.quant import fp8_qdq, fp8_qdq_lowprec
from oracles.rope import ROPE_DIM, apply_rope, apply_rope_lowprec

KV_QAT_BLOCK = 64


def nope_fp8_qdq(kv: torch.Tensor, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """§2.3/§4 QAT simulation of a kv row: FP8 qdq (block 64, ue8m0) of the NoPE dims; RoPE dims kept. fp32."""
    return torch.cat((fp8_qdq(kv[..., :-rope_dim], KV_QAT_BLOCK), kv[..., -rope_dim:].float()), dim=-1)


def nope_fp8_qdq_lowprec(kv: torch.Tensor, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """The reference's in-place `act_quant(kv[..., :-rd], 64, inplace=True)`, in kv.dtype."""
    return torch.cat((fp8_qdq_lowprec(kv[..., :-rope_dim], KV_QAT_BLOCK), kv[..., -rope_dim:]), dim=-1)


def q_projection(x: torch.Tensor, wq_a: Weight, q_norm_weight: torch.Tensor, wq_b: Weight, n_heads: int,
                 positions: torch.Tensor, freqs: torch.Tensor, eps: float = NORM_EPS):
    """FP32 oracle of the q path (§4).

    x: [..., D] attention input (after attn_norm); wq_a [q_lora, D]; q_norm_weight [q_lora];
    wq_b [H·hd, q_lora]; freqs: the layer's `rope_freqs` table.
    Returns (q fp32 [..., H, hd], qr fp32 [..., q_lora]); qr also feeds the indexer (§6).
    """
    qr = rmsnorm(linear(x, wq_a), q_norm_weight, eps)
    q = rmsnorm(linear(qr, wq_b).unflatten(-1, (n_heads, -1)), None, eps)
    return apply_rope(q, positions.unsqueeze(-1), freqs), qr


def q_projection_lowprec(x: torch.Tensor, wq_a: Weight, q_norm_weight: torch.Tensor, wq_b: Weight, n_heads: int,
                         positions: torch.Tensor, freqs: torch.Tensor, eps: float = NORM_EPS):
    """The reference's q path in bf16: GEMMs per §2.6, q_norm in fp32 → bf16, the per-head norm
    computed in q's own dtype (`q *= rsqrt(q.square().mean(-1) + eps)`), RoPE in fp32 → bf16."""
    qr = rmsnorm_lowprec(linear_lowprec(x, wq_a), q_norm_weight, eps)
    q = linear_lowprec(qr, wq_b).unflatten(-1, (n_heads, -1))
    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)
    return apply_rope_lowprec(q, positions.unsqueeze(-1), freqs), qr


def kv_projection(x: torch.Tensor, wkv: Weight, kv_norm_weight: torch.Tensor, positions: torch.Tensor,
                  freqs: torch.Tensor, eps: float = NORM_EPS, qat: bool = True) -> torch.Tensor:
    """FP32 oracle of the window kv latent (§4): x [..., D] → fp32 [..., 512], K = V for every head.

    qat=False skips the FP8 simulation of the 448 NoPE dims (a pure-FP32 oracle, §12.2).
    """
    kv = apply_rope(rmsnorm(linear(x, wkv), kv_norm_weight, eps), positions, freqs)
    return nope_fp8_qdq(kv) if qat else kv


def kv_projection_lowprec(x: torch.Tensor, wkv: Weight, kv_norm_weight: torch.Tensor, positions: torch.Tensor,
                          freqs: torch.Tensor, eps: float = NORM_EPS, qat: bool = True) -> torch.Tensor:
    """The reference's kv path in bf16: wkv GEMM, kv_norm → bf16, RoPE → bf16, in-place FP8 qdq → bf16."""
    kv = apply_rope_lowprec(rmsnorm_lowprec(linear_lowprec(x, wkv), kv_norm_weight, eps), positions, freqs)
    return nope_fp8_qdq_lowprec(kv) if qat else kv
