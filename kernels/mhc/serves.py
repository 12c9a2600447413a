"""The model ops this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py): the
model's fp32 streams in, the bf16 kernels in between (the official model keeps its residual
streams in bf16), fp32 out; and `embed`, the lookup that fills the streams, in the table's dtype
as its oracle returns (the model casts it to its stream dtype)."""

from __future__ import annotations

import torch

from dsv4bench.core.registry import Unsupported
from oracles.mhc import HC_EPS, HC_MULT, SINKHORN_ITERS
from oracles.norm import NORM_EPS


def hc_pre(run, x, fn, scale, base, iters: int = SINKHORN_ITERS, hc_eps: float = HC_EPS,
           norm_eps: float = NORM_EPS):
    """The model's `hc_pre` op: (y, post, comb) from the [S, hc, D] streams."""
    if (iters, hc_eps, norm_eps) != (SINKHORN_ITERS, HC_EPS, NORM_EPS):
        raise Unsupported(f"hc_pre: the kernel is built for {SINKHORN_ITERS} Sinkhorn iterations, hc_eps {HC_EPS}, "
                          f"norm_eps {NORM_EPS}; got {iters}, {hc_eps}, {norm_eps}")
    lead, (hc, d) = x.shape[:-2], x.shape[-2:]
    streams = x.reshape(-1, hc, d)
    inputs = {"x": streams.bfloat16().contiguous(), "fn": fn.float().contiguous(),
              "scale": scale.float().contiguous(), "base": base.float().contiguous()}
    out = run({"op": "pre", "t": streams.shape[0], "d": d, "dtype": "bf16"}, inputs)
    return (out["y"].float().reshape(*lead, d), out["post"].float().reshape(*lead, hc),
            out["comb"].float().reshape(*lead, hc, hc))


def hc_post(run, o, residual, post, comb):
    """The model's `hc_post` op: the new [S, hc, D] streams."""
    hc, d = residual.shape[-2:]
    inputs = {"o": o.reshape(-1, d).bfloat16().contiguous(), "residual": residual.reshape(-1, hc, d).bfloat16().contiguous(),
              "post": post.reshape(-1, hc).float().contiguous(), "comb": comb.reshape(-1, hc, hc).float().contiguous()}
    out = run({"op": "post", "t": inputs["o"].shape[0], "d": d, "dtype": "bf16"}, inputs)
    return out["out"].float().reshape(residual.shape)


EMBED_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def embed(run, ids, embed_weight, hc_mult: int = HC_MULT):
    """The model's `embed` op: ids [...] → [..., hc, D] in the table's dtype, every stream the row.
    An id outside [-V, V) aborts the launch (kernels/mhc/embed.py), as torch's CUDA gather does, and
    the CUDA context with it: the engine names such an id before any kernel runs (Engine.feed)."""
    if hc_mult != HC_MULT:
        raise Unsupported(f"embed: the kernel fills {HC_MULT} streams, got hc_mult {hc_mult}")
    dtype = EMBED_DTYPES.get(embed_weight.dtype)
    if dtype is None:
        raise Unsupported(f"embed: the kernel copies bf16 or fp32 rows, the table is {embed_weight.dtype}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise Unsupported(f"embed: ids must be integers, got {ids.dtype}")
    v, d = embed_weight.shape
    flat = ids.reshape(-1).long().contiguous()  # no copy for the model's int64 ids
    if not flat.numel():
        return embed_weight.new_empty(*ids.shape, hc_mult, d)
    inputs = {"ids": flat, "weight": embed_weight.contiguous()}
    out = run({"op": "embed", "t": flat.numel(), "d": d, "v": v, "ids": "model", "dtype": dtype}, inputs)
    return out["out"].reshape(*ids.shape, hc_mult, d)


OPS = {"embed": embed, "hc_pre": hc_pre, "hc_post": hc_post}
