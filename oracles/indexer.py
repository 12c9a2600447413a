"""Lightning indexer oracles (docs/model-math.md §6), CSA layers only.

    qI = fp4_qdq(Hadamard_128(RoPE_t(wq_b(qr).view(64, 128))))      (RoPE on the last 64 dims)
    w_{t,h} = weights_proj(x_t)_h · 128^-0.5 · 64^-0.5
    I(t, s) = Σ_h w_{t,h} · ReLU(qI_{t,h} · kI_s),   valid only for s < ⌊(t+1)/4⌋
    sel(t)  = top-k_s I(t, s), k = min(index_topk, number of entries), invalid picks → −1
The keys kI_s are the indexer compressor's entries (`oracles.compressor.postprocess(indexer=True)`).
Top-k is a set: compare selections as sets and allow ties (§6, docs/benchmarking.md rule 5).
"""

from __future__ import annotations

import torch

from oracles.compressor import CSA_RATIO, INDEXER_FP4_BLOCK, visible_entries
from oracles.hadamard import hadamard_rotate, hadamard_rotate_lowprec
from oracles.linear import Weight, linear, linear_lowprec
from oracles.quant import fp4_qdq, fp4_qdq_lowprec
from oracles.rope import apply_rope, apply_rope_lowprec


def indexer_queries(qr: torch.Tensor, wq_b: Weight, n_heads: int, positions: torch.Tensor, freqs: torch.Tensor,
                    qat: bool = True) -> torch.Tensor:
    """FP32 oracle of the indexer queries (§6). qr: [..., q_lora] (the q_norm'd latent of §4);
    wq_b: [H_I·hd, q_lora]; positions: shaped qr.shape[:-1]. Returns fp32 [..., H_I, hd].

    qat=False skips the FP4 simulation (the rotation is then a no-op for scoring, §2.5).
    """
    q = apply_rope(linear(qr, wq_b).unflatten(-1, (n_heads, -1)), positions.unsqueeze(-1), freqs)
    q = hadamard_rotate(q)
    return fp4_qdq(q, INDEXER_FP4_BLOCK) if qat else q


def indexer_queries_lowprec(qr: torch.Tensor, wq_b: Weight, n_heads: int, positions: torch.Tensor,
                            freqs: torch.Tensor, qat: bool = True) -> torch.Tensor:
    """The reference's query path in bf16: FP8 GEMM → bf16, RoPE → bf16, Hadamard → bf16, FP4 qdq → bf16."""
    q = apply_rope_lowprec(linear_lowprec(qr, wq_b).unflatten(-1, (n_heads, -1)), positions.unsqueeze(-1), freqs)
    q = hadamard_rotate_lowprec(q)
    return fp4_qdq_lowprec(q, INDEXER_FP4_BLOCK) if qat else q


def head_weight_scale(n_heads: int, head_dim: int) -> float:
    """§6: softmax_scale · n_heads^-0.5 = head_dim^-0.5 · n_heads^-0.5 (0.0110485 for 64 × 128)."""
    return head_dim**-0.5 * n_heads**-0.5


def indexer_weights(x: torch.Tensor, weights_proj: Weight, head_dim: int = 128) -> torch.Tensor:
    """FP32 oracle of the per-head weights (§6): x [..., D] (attention input) → fp32 [..., H_I]."""
    w = linear(x, weights_proj)
    return w * head_weight_scale(w.shape[-1], head_dim)


def indexer_weights_lowprec(x: torch.Tensor, weights_proj: Weight, head_dim: int = 128) -> torch.Tensor:
    """The reference: bf16 `weights_proj(x)` times the scale, in bf16."""
    w = linear_lowprec(x, weights_proj)
    return w * head_weight_scale(w.shape[-1], head_dim)


def causal_entry_mask(positions: torch.Tensor, n_entries: int, m: int = CSA_RATIO) -> torch.Tensor:
    """§5.6: True where entry s is visible to the query at position t (s < ⌊(t+1)/m⌋). [..., n_entries]."""
    return torch.arange(n_entries, device=positions.device) < visible_entries(positions, m).unsqueeze(-1)


def indexer_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor,
                   m: int = CSA_RATIO) -> torch.Tensor:
    """FP32 oracle of I(t, s) (§6). q: [B, S, H, hd]; k: [B, N, hd] compressed indexer keys;
    weights: [B, S, H]; positions: [B, S] or [S]. Returns fp32 [B, S, N] (fp64 for fp64 q: true math),
    −inf where s is not visible.
    """
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    logits = torch.einsum("bshd,bnd->bshn", q.to(dtype), k.to(dtype)).relu()
    scores = (logits * weights.to(dtype).unsqueeze(-1)).sum(dim=2)
    return scores.masked_fill(~causal_entry_mask(positions, k.shape[1], m), float("-inf"))


def indexer_scores_lowprec(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor,
                           m: int = CSA_RATIO) -> torch.Tensor:
    """The reference in bf16: bf16 einsum, relu, times bf16 weights, sum over heads in bf16; fp32 mask."""
    logits = torch.einsum("bshd,bnd->bshn", q, k).relu()
    scores = (logits * weights.unsqueeze(-1)).sum(dim=2).float()
    return scores.masked_fill(~causal_entry_mask(positions, k.shape[1], m), float("-inf"))


def indexer_topk(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """§6 selection: scores [..., N] (−inf = not visible) → int64 [..., min(topk, N)], invalid picks = −1.

    Entry indices are local (0..N−1); add the kv offset when building attention indices (§7.1).
    Exact ties (common: ReLU zeroes whole rows of scores) go to the lower index, deterministically,
    so a prefill and an incremental decode select the same set.
    """
    k = min(topk, scores.shape[-1])
    values, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    values, idx = values[..., :k], idx[..., :k]
    return torch.where(torch.isneginf(values), torch.full_like(idx, -1), idx)
