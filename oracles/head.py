"""Final head, MTP input and sampler oracles (docs/model-math.md §9).

    logits = RMSNorm_{norm}(hc_head(X_final)) @ headᵀ          (fp32; the reference keeps only the
                                                                 last position, these keep all)
    MTP:  X0 = e_proj(RMSNorm_{enorm}(embed(next_ids))) + h_proj(RMSNorm_{hnorm}(Xm))   per stream
          X1 = Block(X0)  (a SWA-only, non-hash layer: the model runner composes it from the per-op
          oracles);  logits = head(RMSNorm_{mtp.norm}(hc_head_{mtp}(X1)))
    sample: T = 0 → argmax; else argmax(softmax(logits / max(T, 1e-5)) / Exponential(1))  (Gumbel-max)
"""

from __future__ import annotations

import torch

from oracles.linear import Weight, linear, linear_lowprec
from oracles.mhc import hc_head, hc_head_lowprec
from oracles.norm import NORM_EPS, rmsnorm, rmsnorm_lowprec

MIN_TEMPERATURE = 1e-5


def lm_logits(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
              norm_weight: torch.Tensor, head_weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """FP32 oracle of §9.1 (also the MTP head with the mtp.0 hc_head/norm parameters).

    x: [..., hc, D] final residual streams; hc_fn [hc, hc·D], hc_scale [1], hc_base [hc];
    norm_weight [D]; head_weight [V, D]. Returns fp32 [..., V].
    """
    return rmsnorm(hc_head(x, hc_fn, hc_scale, hc_base, norm_eps=eps), norm_weight, eps) @ head_weight.float().T


def lm_logits_lowprec(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                      norm_weight: torch.Tensor, head_weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """The reference: hc_head → bf16, norm → bf16, then `x.float() @ head.float().T` in fp32."""
    y = rmsnorm_lowprec(hc_head_lowprec(x, hc_fn, hc_scale, hc_base, norm_eps=eps), norm_weight, eps)
    return y.float() @ head_weight.float().T


def mtp_input(x: torch.Tensor, next_ids: torch.Tensor, embed_weight: torch.Tensor, enorm_weight: torch.Tensor,
              hnorm_weight: torch.Tensor, e_proj: Weight, h_proj: Weight, eps: float = NORM_EPS) -> torch.Tensor:
    """FP32 oracle of the MTP block's input (§9.2).

    x: [..., hc, D] the main model's final streams before hc_head; next_ids: [...] the shifted ids
    (the caller aligns them); e_proj, h_proj: [D, D]. Returns fp32 [..., hc, D].
    """
    e = rmsnorm(embed_weight[next_ids], enorm_weight, eps)
    return linear(e, e_proj).unsqueeze(-2) + linear(rmsnorm(x, hnorm_weight, eps), h_proj)


def mtp_input_lowprec(x: torch.Tensor, next_ids: torch.Tensor, embed_weight: torch.Tensor,
                      enorm_weight: torch.Tensor, hnorm_weight: torch.Tensor, e_proj: Weight, h_proj: Weight,
                      eps: float = NORM_EPS) -> torch.Tensor:
    """The reference in bf16: norms → bf16, FP8 GEMMs → bf16, the broadcast sum in bf16."""
    e = rmsnorm_lowprec(embed_weight[next_ids], enorm_weight, eps)
    return linear_lowprec(e, e_proj).unsqueeze(-2) + linear_lowprec(rmsnorm_lowprec(x, hnorm_weight, eps), h_proj)


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """§9.3 sampler: logits [..., V] → token ids int64 [...].

    temperature 0 → argmax; otherwise Gumbel-max with exponential noise drawn from `generator`
    (seedable), which samples exactly from softmax(logits / T).
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / max(temperature, MIN_TEMPERATURE), dim=-1)
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(-1)
