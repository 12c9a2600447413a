"""RMSNorm oracles (docs/model-math.md §2.1).

`RMSNorm_w(x) = cast_in_dtype(w ⊙ (x_f32 · rsqrt(mean(x_f32², -1) + eps)))`, eps = 1e-6.
The weightless variant (weight=None) is the per-head q norm (§4), the mHC pre-norm (§3.3)
and the hc-head pre-norm (§3.5).
"""

from __future__ import annotations

import torch

NORM_EPS = 1e-6


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = NORM_EPS, compute_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """FP32 oracle of RMSNorm over the last dim (§2.1).

    x: [..., D] any float dtype; weight: [D] or None (weightless variant).
    Returns [..., D] in compute_dtype (fp32; fp64 is the "true math" reference for fp32
    kernels, whose own rounding an fp32 oracle would not see); no rounding to the input dtype.
    """
    x32 = x.to(compute_dtype)
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute_dtype)
    return y


def rmsnorm_lowprec(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = NORM_EPS) -> torch.Tensor:
    """Low-precision reference of RMSNorm in the reference's op order (§2.1).

    x.float() → x·rsqrt(mean(x²)+eps) → ·weight (held in fp32) → cast to x.dtype.
    x: [..., D] (bf16 in the model); weight: [D] or None. Returns [..., D] in x.dtype.
    """
    return rmsnorm(x, weight, eps).to(x.dtype)
