"""Linear-layer oracles for the checkpoint's weight formats (docs/model-math.md §2.6).

A weight is either a plain tensor (bf16/fp32: `F.linear` in the tensor dtype) or a `QuantWeight`
as the checkpoint stores it:
* FP8 e4m3 [out, in] + E8M0 scale [⌈out/128⌉, ⌈in/128⌉]            (attention / shared expert / MTP),
* MXFP4 packed int8 [out, in/2] + E8M0 scale [out, in/32]           (routed experts),
* NVFP4 packed uint8 [out, in/2] + e4m3 scale [out, in/16] + fp32 global scale (NVIDIA requantised).

FP32 oracle: `y = x @ dequant(W).T` (§2.6). The low-precision reference follows the reference
GEMMs: the activation is FP8-quantised per 128 along K with ue8m0 scales (§2.3), the products
accumulate in fp32 and the output is bf16. NVFP4 checkpoints are out of the reference's scope;
their low-precision path keeps the activation unquantised (weight-only dequant).
"""

from __future__ import annotations

from typing import NamedTuple, Union

import torch
import torch.nn.functional as F

from oracles.quant import dequant_fp4_weight, dequant_fp8_weight, dequant_nvfp4_weight, fp8_qdq

ACT_QUANT_BLOCK = 128


class QuantWeight(NamedTuple):
    """A quantised checkpoint weight: codes, block scales, and the NVFP4 global scale (else None)."""

    weight: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None = None

    @property
    def format(self) -> str:
        if self.weight.dtype == torch.float8_e4m3fn:
            return "fp8"
        if self.global_scale is not None:
            return "nvfp4"
        if self.weight.dtype in (torch.int8, torch.uint8):
            return "mxfp4"
        raise ValueError(f"unrecognised quantised weight dtype {self.weight.dtype}")


Weight = Union[torch.Tensor, QuantWeight]


def dequant(w: Weight) -> torch.Tensor:
    """The fp32 weight [out, in] that a `Weight` encodes (§2.6)."""
    if isinstance(w, torch.Tensor):
        return w.float()
    fmt = w.format
    if fmt == "fp8":
        return dequant_fp8_weight(w.weight, w.scale)
    if fmt == "mxfp4":
        return dequant_fp4_weight(w.weight, w.scale)
    return dequant_nvfp4_weight(w.weight, w.scale, w.global_scale)


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """FP32 oracle of `linear(x, W)` (§2.6): x [..., in] → fp32 [..., out] = x @ dequant(W).T."""
    return x.float() @ dequant(w).T


def linear_lowprec(x: torch.Tensor, w: Weight, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The reference GEMM path (§2.6): x [..., in] → [..., out].

    Plain weights: `F.linear` in the weight's dtype (output in that dtype). FP8 / MXFP4 weights: FP8
    act-quant (block 128, ue8m0), fp32 accumulation of the dequantised operands, bf16 output.
    out_dtype overrides the output dtype.
    """
    if isinstance(w, torch.Tensor):
        y = F.linear(x.to(w.dtype), w)
    elif w.format == "nvfp4":
        y = (x.float() @ dequant(w).T).bfloat16()
    else:
        y = (fp8_qdq(x, ACT_QUANT_BLOCK) @ dequant(w).T).bfloat16()
    return y if out_dtype is None else y.to(out_dtype)


def grouped_linear(x: torch.Tensor, w: Weight, groups: int) -> torch.Tensor:
    """FP32 oracle of a grouped linear (the output projection's wo_a, §7.4): x [..., G·K] and W
    [G·N, K] → fp32 [..., G·N] where output group g is x[..., gK:(g+1)K] @ W[gN:(g+1)N].T (a
    block-diagonal weight). `groups` = 1 is `linear`."""
    wd = dequant(w)
    grouped = x.float().unflatten(-1, (groups, -1))  # [..., G, K]
    return torch.einsum("...gk,gnk->...gn", grouped, wd.unflatten(0, (groups, -1))).flatten(-2)
