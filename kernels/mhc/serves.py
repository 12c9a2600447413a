"""The model ops this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py): the
model's fp32 streams in, the bf16 kernels in between (the official model keeps its residual
streams in bf16), fp32 out."""

from __future__ import annotations

from dsv4bench.core.registry import Unsupported
from oracles.mhc import HC_EPS, SINKHORN_ITERS
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


OPS = {"hc_pre": hc_pre, "hc_post": hc_post}
