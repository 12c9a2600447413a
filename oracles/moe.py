"""MoE FFN oracles (docs/model-math.md §8): sqrt-softplus router with hash routing, clamped SwiGLU
experts (routed and shared), combine.

    s = sqrt(softplus(x·Gᵀ))  (fp32);  idx = tid2eid[ids] (hash layers) or topk(s + bias, k), ties lower id first
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
from oracles.quant import fp8_block_quant

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
        # equal biased scores: the lower expert id first, at the k-th place too (torch.topk's pick among equal
        # values is unspecified; a stable descending sort makes the oracle one answer, the kernels' rule)
        idx = biased.sort(dim=-1, descending=True, stable=True).indices[..., :n_activated]
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


def _routed(x, weights, idx, experts, limit, run):
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in idx.unique().tolist():
        rows, slot = torch.where(idx == e)
        y.index_add_(0, rows, run(x[rows], experts[e], weights[rows, slot, None], limit).float())
    return y


def routed(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
           limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """FP32 oracle of the routed part of §8.3: Σ_k expert_{idx_k}(x; w_k), fp32 [T, D]. A token routed
    twice to one expert (hash layers can) counts twice."""
    return _routed(x, weights, idx, experts, limit, expert)


def routed_lowprec(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
                   limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """The reference's routed part: each expert's bf16 output (`expert_lowprec`) accumulated in fp32."""
    return _routed(x, weights, idx, experts, limit, expert_lowprec)


def _combine(x, weights, idx, experts, shared, limit, run):
    return _routed(x, weights, idx, experts, limit, run) + run(x, shared, None, limit).float()


def moe(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
        shared: ExpertWeights, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """FP32 oracle of the combine (§8.3). x [T, D]; weights, idx [T, k] from `route`. Returns fp32 [T, D]."""
    return _combine(x, weights, idx, experts, shared, limit, expert)


def moe_lowprec(x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, experts: Sequence[ExpertWeights],
                shared: ExpertWeights, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """The reference MoE: bf16 expert outputs accumulated in fp32, plus the shared expert, cast to x.dtype."""
    return _combine(x, weights, idx, experts, shared, limit, expert_lowprec).to(x.dtype)


# ---------------------------------------------------------------- token permutation (dispatch / combine)
# The grouped GEMMs read the routed tokens sorted by expert. Row r of a layout holds one (token, slot)
# entry; within an expert the entries keep their flattened (t, k) order, so the layout is a function
# of idx alone (a kernel must be deterministic to be compared exactly).
#   contiguous (prefill): expert e's segment starts at Σ_{e' < e} align(count_e', TILE_M), padding
#       rows (src = -1, expert = -1) fill each segment to the tile and the tail up to `rows`;
#   masked (decode): expert e's rows are e·max_m .. e·max_m + count_e − 1 ([E, max_m, K]); entries past
#       max_m are dropped (pos = −1; the glue refuses such counts with a ValueError).
TILE_M = 128  # the grouped GEMM's M tile (DeepGEMM's contiguous-layout alignment on SM90)


def contiguous_rows(tokens: int, topk: int, n_experts: int, tile: int = TILE_M) -> int:
    """Rows a contiguous layout may need, known before the routing is: Σ_e align(count_e, tile) with
    Σ count_e ≤ T·k and at most min(E, T·k) experts non-empty, rounded down to whole tiles."""
    entries = tokens * topk
    return (entries + (tile - 1) * min(n_experts, entries)) // tile * tile


def dispatch_layout(idx: torch.Tensor, weights: torch.Tensor, n_experts: int, rows: int,
                    max_m: int | None = None, tile: int = TILE_M) -> dict:
    """The permutation of a router output idx int [T, k] (weights fp32 [T, k]) into `rows` layout rows:
    contiguous when max_m is None, else masked (rows = E·max_m). Ids outside [0, E) are not routed.

    Returns int32 counts [E] (entries per expert, before any max_m cut), pos [T, k] (the row of each
    entry, −1 if none), src [rows] (its token, −1 on padding), expert [rows] (its expert, −1 on
    padding: DeepGEMM's contiguous `grouped_layout`), and fp32 row_weight [rows] (its route weight, 0)."""
    t, k = idx.shape
    flat = idx.reshape(-1).long()
    valid = (flat >= 0) & (flat < n_experts)
    key = torch.where(valid, flat, torch.full_like(flat, n_experts))
    order = torch.sort(key, stable=True).indices
    sorted_e = key[order]
    counts = torch.bincount(key, minlength=n_experts + 1)[:n_experts]
    first = torch.cumsum(counts, 0) - counts
    seg = torch.full_like(counts, max_m) if max_m is not None else (counts + tile - 1) // tile * tile
    offsets = torch.cumsum(seg, 0) - seg
    keep = sorted_e < n_experts
    e_kept = sorted_e[keep]
    rank = torch.arange(t * k, device=idx.device)[keep] - first[e_kept]
    if max_m is not None:
        fits = rank < max_m
        e_kept, rank, kept_order = e_kept[fits], rank[fits], order[keep][fits]
    else:
        kept_order = order[keep]
    row = offsets[e_kept] + rank
    if row.numel() and int(row.max()) >= rows:
        raise ValueError(f"rows={rows} is too few for this routing (needs {int(row.max()) + 1})")
    pos = torch.full((t * k,), -1, dtype=torch.int32, device=idx.device)
    pos[kept_order] = row.int()
    src = torch.full((rows,), -1, dtype=torch.int32, device=idx.device)
    src[row] = (kept_order // k).int()
    expert = torch.full((rows,), -1, dtype=torch.int32, device=idx.device)
    expert[row] = e_kept.int()
    row_weight = torch.zeros(rows, dtype=torch.float32, device=idx.device)
    row_weight[row] = weights.reshape(-1).float()[kept_order]
    return {"counts": counts.int(), "pos": pos.view(t, k), "src": src, "expert": expert, "row_weight": row_weight}


def gather_quant(x: torch.Tensor, src: torch.Tensor, groups: int = 1):
    """The activations of the layout rows: FP8 e4m3 codes (uint8 [rows, D]) of x[src] with ue8m0 fp32
    scales per 128 (§2.3), 0 on padding rows (src = −1). Scales MN-major, as the grouped GEMM's TMA
    reads them: [D/128, rows] for one group (contiguous), [E, D/128, max_m] for `groups` = E (masked)."""
    rows, d = src.numel(), x.shape[1]
    codes = torch.zeros(rows, d, dtype=torch.uint8, device=x.device)
    scales = torch.zeros(rows, d // 128, dtype=torch.float32, device=x.device)
    real = src >= 0
    q, s = fp8_block_quant(x[src[real].long()], 128)
    codes[real], scales[real] = q.view(torch.uint8), s
    return codes, scales.view(groups, rows // groups, -1).transpose(1, 2).contiguous().squeeze(0)


def combine(rows: torch.Tensor, pos: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """FP32 oracle of the un-permutation (§8.3): y[t] = Σ_k rows[pos[t, k]] + shared[t], fp32 [T, D].
    The route weights are already in the rows (they multiply the SwiGLU output before w2, §8.2);
    entries with pos = −1 (not routed) add nothing."""
    p = pos.long()
    picked = torch.where((p >= 0).unsqueeze(-1), rows.float()[p.clamp(min=0)], 0.0)
    return picked.sum(1) + shared.float()
