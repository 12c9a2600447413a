"""Exact FP8 checks of a qdq'd NoPE slice (spec §2.3): every 64-block must sit on the e4m3 grid of
its power-of-two scale. A value that skipped the qdq (bf16, 8 significant bits) almost never does."""

from __future__ import annotations

import torch

from oracles.quant import FP8_AMAX_FLOOR, FP8_E4M3_MAX, ue8m0_scale

BLOCK = 64


def off_grid(nope: torch.Tensor) -> int:
    """How many values of nope [..., 64·k] are not e4m3 codes times their block's ue8m0 scale."""
    blocks = nope.float().cpu().unflatten(-1, (-1, BLOCK))
    scale = ue8m0_scale(blocks.abs().amax(-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR), FP8_E4M3_MAX)
    q = blocks / scale
    return int((q.to(torch.float8_e4m3fn).float() != q).sum())  # |q| <= 448: the cast is exact on the grid
