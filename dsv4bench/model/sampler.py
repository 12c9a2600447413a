"""The reference sampler (DSV4_SPEC.md §9.3).

temperature 0 → argmax; otherwise softmax(logits / max(T, 1e-5)) in fp32 and Gumbel-max through
exponential noise, `argmax(probs / Exponential(1))`, which draws from the same distribution as
multinomial sampling. The noise comes from a CPU generator, so a seed gives the same tokens on
every device.
"""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    """logits [V] (any device) → token id."""
    logits = logits.float().cpu()
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / max(temperature, 1e-5), dim=-1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=gen)
    return int((probs / noise).argmax())
