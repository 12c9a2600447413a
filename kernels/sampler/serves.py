"""The model op this family's kernel serves (Family.serves; dsv4bench/model/kernel_ops.py): `sample`,
one row of logits on the GPU. The noise is the oracle's: Exponential(1) drawn on the CPU from the
sequence's generator, the same draw `oracles.head.sample` makes (so a seed gives the same tokens on
either backend), then copied to the GPU; at T = 0 the kernel takes the argmax and no draw is made.
The kernel ranks by l/T − log n where the oracle takes argmax(softmax(l/T) / n): the same token
(the family compares tokens exactly, docs/perf/sampler.md)."""

from __future__ import annotations

import torch


def sample(run, logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The model's `sample` op: logits [..., V] → token ids int64 [...] (on the logits' device)."""
    rows = logits.reshape(-1, logits.shape[-1]).float().contiguous()
    b, v = rows.shape
    if temperature == 0:
        noise = torch.ones_like(rows)  # not read at T = 0 (the kernel's ranking drops it)
    else:
        noise = torch.empty(b, v).exponential_(1, generator=generator).to(rows.device)
    temps = torch.full((b,), float(temperature), device=rows.device)
    out = run({"b": b, "v": v, "temperature": float(temperature)}, {"logits": rows, "temperatures": temps, "noise": noise})
    return out["tokens"].reshape(logits.shape[:-1])


OPS = {"sample": sample}
