"""MoE FFN oracles (docs/model-math.md §8): sqrt-softplus router with hash routing, clamped SwiGLU
experts (routed and shared), combine.

    s = sqrt(softplus(x·Gᵀ))  (fp32);  idx = tid2eid[ids] (hash layers) or topk(s + bias, k)
    w = s[idx] / Σ s[idx] · route_scale          (the bias only selects; weights use unbiased s)
    expert(x; w) = w2( w · silu(min(g, L)) · clamp(u, −L, L) ),  g = w1(x), u = w3(x), L = 10
    y = Σ_k expert_{idx_k}(x; w_k) + shared(x)   (fp32 accumulation, cast bf16)
Input x is RMSNorm_{ffn_norm}(hc_pre_ffn(X)), flattened to [T, D].
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from oracles.linear import Weight, linear, linear_lowprec

SWIGLU_LIMIT = 10.0


class ExpertWeights(NamedTuple):
    """One SwiGLU expert: w1 (gate) [I, D], w2 (down) [D, I], w3 (up) [I, D]."""

    w1: Weight
    w2: Weight
    w3: Weight


def router_scores(x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """§8.1 "sqrtsoftplus" scores: x [T, D], gate_weight [E, D] → fp32 [T, E] = sqrt(softplus(x·Gᵀ))."""
    return F.softplus(x.float() @ gate_weight.float().T).sqrt()


def route(x: torch.Tensor, gate_weight: torch.Tensor, n_activated: int, route_scale: float,
          bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None,
          input_ids: torch.Tensor | None = None):
    """§8.1 router. x [T, D]; bias [E] (non-hash layers) or tid2eid [vocab, k] + input_ids [T] (hash layers).

    Returns (weights fp32 [T, k] summing to route_scale, expert ids int64 [T, k]). The reference
    router runs in fp32, so this is also the low-precision reference.
    """
    scores = router_scores(x, gate_weight)
    if tid2eid is not None:
        idx = tid2eid[input_ids].long()
    else:
        biased = scores if bias is None else scores + bias.float()
        idx = biased.topk(n_activated, dim=-1).indices
    weights = scores.gather(-1, idx)
    return weights / weights.sum(-1, keepdim=True) * route_scale, idx


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """§8.2 clamped SwiGLU in fp32: silu(min(gate, limit)) · clamp(up, −limit, limit)."""
    return F.silu(gate.float().clamp(max=limit)) * up.float().clamp(-limit, limit)


def expert(x: torch.Tensor, w: ExpertWeights, route_weight: torch.Tensor | None = None,
           limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """FP32 oracle of one expert (§8.2). x [T, D]; route_weight [T, 1] or None (shared expert).

    The routing weight multiplies the SwiGLU output before w2. Returns fp32 [T, D].
    """
    h = swiglu(linear(x, w.w1), linear(x, w.w3), limit)
    if route_weight is not None:
        h = route_weight.float() * h
    return linear(h, w.w2)


def expert_lowprec(x: torch.Tensor, w: ExpertWeights, route_weight: torch.Tensor | None = None,
                   limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """The reference expert: GEMMs per §2.6, SwiGLU and weighting in fp32, cast to x.dtype before w2."""
    h = swiglu(linear_lowprec(x, w.w1).float(), linear_lowprec(x, w.w3).float(), limit)
    if route_weight is not None:
        h = route_weight.float() * h
    return linear_lowprec(h.to(x.dtype), w.w2)


def _combine(x, weights, idx, experts, shared, limit, run):
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in idx.unique().tolist():
        rows, slot = torch.where(idx == e)
        y[rows] += run(x[rows], experts[e], weights[rows, slot, None], limit).float()
    return y + run(x, shared, None, limit).float()


def moe(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
        shared: ExpertWeights, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """FP32 oracle of the combine (§8.3). x [T, D]; weights, idx [T, k] from `route`. Returns fp32 [T, D]."""
    return _combine(x, weights, idx, experts, shared, limit, expert)


def moe_lowprec(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
                shared: ExpertWeights, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """The reference MoE: bf16 expert outputs accumulated in fp32, plus the shared expert, cast to x.dtype."""
    return _combine(x, weights, idx, experts, shared, limit, expert_lowprec).to(x.dtype)
