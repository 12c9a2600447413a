"""The torch peers of the quant family: the reference's math composed in torch, on any device.

Output convention (shared with the kernel and the family's oracle): `codes` uint8 — e4m3 bits per
element (fp8) or packed e2m1 nibbles, element 2k low (mxfp4) — and `scales` uint8 ue8m0 bytes.
FP8 uses the oracle's own torch functions, which already run on any device; the MXFP4 path needs a
device-resident e2m1 grid and Hadamard matrix (the oracle builds both on the CPU).
"""

from __future__ import annotations

import torch

from oracles.hadamard import hadamard_matrix
from oracles.quant import (
    E2M1_GRID, FP4_AMAX_FLOOR, FP4_E2M1_MAX, fp8_block_quant, pack_fp4, ue8m0_encode, ue8m0_scale,
)


def fp8_quant(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scale = fp8_block_quant(x, block, "ue8m0")
    return codes.view(torch.uint8), ue8m0_encode(scale)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """bf16(x @ H_n · n^-0.5) computed in fp32, as fast_hadamard_transform does (spec §2.5)."""
    n = x.shape[-1]
    h = hadamard_matrix(n).to(x.device)
    return ((x.float() @ h) * n**-0.5).to(x.dtype)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """RNE to e2m1 codes 0..15 (ties to the even code; −0 → +0), |v| saturating at 6."""
    grid = torch.tensor(E2M1_GRID, device=v.device)
    mid = (grid[:-1] + grid[1:]) / 2
    mag = v.abs().unsqueeze(-1)
    odd_below = torch.arange(len(mid), device=v.device) % 2 == 1
    idx = torch.where(odd_below, mag >= mid, mag > mid).sum(-1).to(torch.uint8)
    return idx | (((v < 0) & (idx > 0)).to(torch.uint8) << 3)


def mxfp4_quant(x: torch.Tensor, rotated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if rotated:
        x = rotate(x)
    xb = x.float().unflatten(-1, (-1, 32))
    scale = ue8m0_scale(xb.abs().amax(-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR), FP4_E2M1_MAX)
    codes = e2m1_codes((xb / scale).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)).flatten(-2)
    return pack_fp4(codes), ue8m0_encode(scale.squeeze(-1))


def quant(x: torch.Tensor, fmt: str, block: int, rotated: bool) -> dict:
    codes, scales = fp8_quant(x, block) if fmt == "fp8" else mxfp4_quant(x, rotated)
    return {"codes": codes, "scales": scales}
