"""The model ops this family's kernel serves (Family.serves; dsv4bench/model/kernel_ops.py): the
model's fp32 tensors in, the bf16 kernel in between, fp32 out."""

from __future__ import annotations

from dsv4bench.core.registry import Unsupported
from oracles.norm import NORM_EPS


def rmsnorm(run, x, weight=None, eps: float = NORM_EPS):
    """The model's `rmsnorm` op (attn_norm, ffn_norm, q/kv norms) on the bf16 kernel."""
    if eps != NORM_EPS:
        raise Unsupported(f"rmsnorm: the kernel is built for eps {NORM_EPS}, not {eps}")
    rows = x.reshape(-1, x.shape[-1])
    inputs = {"x": rows.bfloat16().contiguous()}
    if weight is not None:
        inputs["w"] = weight.bfloat16().contiguous()
    params = {"m": rows.shape[0], "n": rows.shape[1], "dtype": "bf16", "weight": weight is not None}
    return run(params, inputs)["out"].float().reshape(x.shape)


OPS = {"rmsnorm": rmsnorm}
