"""The torch peer of the sampler family: spec §9.3 with the noise given, per-row temperatures."""

from __future__ import annotations

import torch

from oracles.head import MIN_TEMPERATURE


def sample_with_noise(logits: torch.Tensor, temperatures: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """logits, noise [B, V] fp32; temperatures [B] → tokens int64 [B]. A T = 0 row takes the argmax."""
    probs = torch.softmax(logits / temperatures.clamp(min=MIN_TEMPERATURE).unsqueeze(-1), dim=-1)
    return torch.where(temperatures == 0, logits.argmax(-1), (probs / noise).argmax(-1))
