"""Embedding and mHC (manifold-constrained hyper-connection) oracles (docs/model-math.md §3).

The residual is `hc_mult` (= 4) streams X ∈ [..., 4, D]. `hc_pre` collapses them into the
sublayer input, `hc_post` expands the sublayer output back and mixes the residual streams with a
Sinkhorn-normalised 4×4 matrix, `hc_head` collapses them before the final norm (§3.5).
Mixes are ordered [pre(4) | post(4) | comb(16, row-major j·4+k)].
"""

from __future__ import annotations

import torch

from oracles.norm import NORM_EPS

HC_MULT = 4
HC_EPS = 1e-6
SINKHORN_ITERS = 20


def embed_streams(ids: torch.Tensor, embed_weight: torch.Tensor, hc_mult: int = HC_MULT) -> torch.Tensor:
    """§3.1: embedding lookup (no scaling) copied into every stream. ids [...] → [..., hc, D] (weight dtype)."""
    h = embed_weight[ids]
    return h.unsqueeze(-2).expand(*h.shape[:-1], hc_mult, h.shape[-1]).clone()


def hc_mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float = NORM_EPS) -> torch.Tensor:
    """§3.3: mixes = (x̄ @ fn.T) · rsqrt(mean(x̄²) + eps) over the flattened streams x̄ ∈ R^{hc·D}.

    x: [..., hc, D]; fn: [n_mix, hc·D] fp32. Returns fp32 [..., n_mix].
    """
    flat = x.flatten(-2).float()
    rsqrt = torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return (flat @ fn.float().T) * rsqrt


def sinkhorn(logits: torch.Tensor, iters: int = SINKHORN_ITERS, eps: float = HC_EPS) -> torch.Tensor:
    """§3.3 Sinkhorn in the kernel's exact op order. logits [..., hc, hc] (rows j, columns k) → fp32.

    Row softmax + eps, column normalise, then (iters − 1) × (row normalise, column normalise),
    each normalisation dividing by (sum + eps). The columns of the result sum to ≈ 1.
    """
    c = torch.softmax(logits.float(), dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_split(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc_mult: int = HC_MULT,
             iters: int = SINKHORN_ITERS, hc_eps: float = HC_EPS):
    """§3.3 `hc_split_sinkhorn`: mixes [..., (2+hc)·hc] → (pre [..., hc], post [..., hc], comb [..., hc, hc]).

    pre = sigmoid(m·scale[0] + b) + eps (not normalised); post = 2·sigmoid(m·scale[1] + b);
    comb = sinkhorn(m·scale[2] + b).
    """
    scale, base = scale.float(), base.float()
    z = mixes.float()
    pre = torch.sigmoid(z[..., :hc_mult] * scale[0] + base[:hc_mult]) + hc_eps
    post = 2 * torch.sigmoid(z[..., hc_mult:2 * hc_mult] * scale[1] + base[hc_mult:2 * hc_mult])
    comb_logits = z[..., 2 * hc_mult:] * scale[2] + base[2 * hc_mult:]
    comb = sinkhorn(comb_logits.unflatten(-1, (hc_mult, hc_mult)), iters, hc_eps)
    return pre, post, comb


def _collapse(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (weights.unsqueeze(-1) * x.float()).sum(-2)


def hc_pre(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
           iters: int = SINKHORN_ITERS, hc_eps: float = HC_EPS, norm_eps: float = NORM_EPS):
    """FP32 oracle of `Block.hc_pre` (§3.3).

    x: [..., hc, D] residual streams; fn [(2+hc)·hc, hc·D], scale [3], base [(2+hc)·hc] (fp32).
    Returns (y fp32 [..., D] = Σ_i pre_i·X_i, post fp32 [..., hc], comb fp32 [..., hc, hc]).
    """
    pre, post, comb = hc_split(hc_mixes(x, fn, norm_eps), scale, base, x.shape[-2], iters, hc_eps)
    return _collapse(x, pre), post, comb


def hc_pre_lowprec(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                   iters: int = SINKHORN_ITERS, hc_eps: float = HC_EPS, norm_eps: float = NORM_EPS):
    """The reference's hc_pre: fp32 math, y cast to x.dtype (bf16); post/comb stay fp32."""
    y, post, comb = hc_pre(x, fn, scale, base, iters, hc_eps, norm_eps)
    return y.to(x.dtype), post, comb


def hc_post(o: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """FP32 oracle of `Block.hc_post` (§3.4): X'_k = post_k·o + Σ_j comb[j, k]·residual_j.

    o: [..., D] sublayer output; residual: [..., hc, D]; post: [..., hc]; comb: [..., hc, hc].
    Returns fp32 [..., hc, D].
    """
    mixed = torch.einsum("...jk,...jd->...kd", comb.float(), residual.float())
    return post.float().unsqueeze(-1) * o.float().unsqueeze(-2) + mixed


def hc_post_lowprec(o: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The reference's hc_post: fp32 math, result cast to o.dtype (residual streams are stored bf16)."""
    return hc_post(o, residual, post, comb).to(o.dtype)


def hc_head(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            hc_eps: float = HC_EPS, norm_eps: float = NORM_EPS) -> torch.Tensor:
    """FP32 oracle of `ParallelHead.hc_head` (§3.5).

    x: [..., hc, D]; fn [hc, hc·D], scale [1], base [hc]. pre_i = sigmoid(mix_i·scale + base_i) + eps.
    Returns fp32 [..., D] = Σ_i pre_i·X_i.
    """
    pre = torch.sigmoid(hc_mixes(x, fn, norm_eps) * scale.float() + base.float()) + hc_eps
    return _collapse(x, pre)


def hc_head_lowprec(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                    hc_eps: float = HC_EPS, norm_eps: float = NORM_EPS) -> torch.Tensor:
    """The reference's hc_head: fp32 math, y cast to x.dtype."""
    return hc_head(x, fn, scale, base, hc_eps, norm_eps).to(x.dtype)
