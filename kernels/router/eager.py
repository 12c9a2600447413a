"""The torch peer of the router family: spec §8.1 from the fp32 gate logits, on any device."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route_from_logits(logits: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
                      input_ids: torch.Tensor | None, topk: int, route_scale: float) -> dict:
    scores = F.softplus(logits).sqrt()
    if tid2eid is not None:
        idx = tid2eid[input_ids].long()
    else:
        idx = (scores + bias).topk(topk, dim=-1).indices
    weights = scores.gather(-1, idx)
    return {"weights": weights / weights.sum(-1, keepdim=True) * route_scale, "indices": idx.to(torch.int32)}
