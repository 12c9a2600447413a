"""The model op this family's kernel serves (Family.serves; dsv4bench/model/kernel_ops.py). The
kernel routes from gate logits: the gate GEMM (x · Gᵀ, fp32) runs in torch until a GEMM family
serves it."""

from __future__ import annotations

import torch

from sweeps.router import VOCAB


def router(run, x, gate_weight, n_activated: int, route_scale: float, bias=None, tid2eid=None, input_ids=None):
    """The model's `router` op: (weights fp32 [T, k], expert ids int64 [T, k])."""
    logits = (x.float() @ gate_weight.float().T).contiguous()
    t, e = logits.shape
    inputs = {"logits": logits}
    hashed = tid2eid is not None
    if hashed:
        inputs["tid2eid"] = tid2eid.to(torch.int32).contiguous()
        inputs["input_ids"] = input_ids.to(torch.int32).contiguous()
    else:
        inputs["bias"] = (bias.float() if bias is not None else torch.zeros(e, device=x.device)).contiguous()
    params = {"t": t, "e": e, "k": n_activated, "scale": float(route_scale), "hashed": hashed,
              "vocab": tid2eid.shape[0] if hashed else VOCAB}
    out = run(params, inputs)
    return out["weights"].float(), out["indices"].long()


OPS = {"router": router}
