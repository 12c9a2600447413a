"""Checkpoint tensors → the parameter dicts `oracles/model.py` reads.

Keys are the checkpoint names relative to their load unit, with `.weight` dropped
("layers.3.attn.wq_a.weight" → "attn.wq_a"). A quantised weight and its scales become one
`QuantWeight` (FP8 / MXFP4: `X.weight` + `X.scale`; NVFP4: `X.weight` + `X.weight_scale` +
`X.weight_scale_2`; the NVFP4 `input_scale` is an activation calibration the FP32 oracle does
not use). The weights stay in their stored format; each op dequantises what it needs.
"""

from __future__ import annotations

import torch

from oracles.linear import QuantWeight

SCALE_SUFFIXES = (".scale", ".weight_scale", ".weight_scale_2", ".input_scale")


def to_params(raw: dict[str, torch.Tensor], prefix: str) -> dict:
    """raw: one load unit's tensors (full names); prefix: "" (top level), "layers.i." or "mtp.k."."""
    out: dict = {}
    for name, t in raw.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        key = name[len(prefix):]
        if not key.endswith(".weight"):
            out[key] = t
            continue
        base = name[: -len(".weight")]
        key = key[: -len(".weight")]
        if f"{base}.scale" in raw:
            out[key] = QuantWeight(t, raw[f"{base}.scale"])
        elif f"{base}.weight_scale" in raw:
            out[key] = QuantWeight(t, raw[f"{base}.weight_scale"], raw[f"{base}.weight_scale_2"])
        else:
            out[key] = t
    return out
