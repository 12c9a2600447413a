"""The model ops this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py), the
compressor's decode-time steps (kernels/compressor_decode/decode.py):

`compressor_push`: one token into the reference's fp32 state, updated in place (the `CompressorState`'s
own kv / score tensors), returning the raw entry fp32 [B, d] when the token completes a block. t is a
host int, so the emission is known without reading the GPU, and the kernel takes t as a scalar: one
compiled kernel for every position.

`compressor_post`: the post-processing of given raw entries (main: FP8 NoPE; indexer, d = 128:
Hadamard + FP4), fp32 out, their RoPE table rows made on the device from the entry ids (no host read).

Refused (Unsupported: the oracle runs the call): QAT off, another eps or RoPE width, a state that is
not fp32 and contiguous, the indexer's post-processing at a width other than 128."""

from __future__ import annotations

import torch

from dsv4bench.core.registry import Unsupported
from kernels.rope.rotate import ROPE_DIM, rope_rows
from oracles.compressor import CompressorState, overlaps
from oracles.norm import NORM_EPS


def compressor_push(run, state: CompressorState, kv, score, t: int):
    """The model's `compressor_push` op (§5.7): token t's kv, score [B, coff·d] into `state` (in place);
    the raw entry fp32 [B, d] when t completes a block, else None."""
    m, t = state.m, int(t)
    if not all(x.dtype == torch.float32 and x.is_contiguous() for x in (state.kv, state.score)):
        raise Unsupported("compressor_push: the kernel updates a contiguous fp32 state in place")
    b, _, w = state.kv.shape
    d = w // 2 if overlaps(m) else w
    inputs = {"kv": state.kv, "score": state.score, "kv_t": kv.float().reshape(b, w).contiguous(),
              "score_t": score.float().reshape(b, w).contiguous()}
    compiled = run.compiled({"op": "push", "m": m, "b": b, "t": t, "d": d, "dtype": "fp32"}, inputs)
    entry = torch.empty(b, d, device=state.kv.device)  # written only when the block completes
    compiled(state.kv, state.score, inputs["kv_t"], inputs["score_t"], entry, t)
    return entry if (t + 1) % m == 0 else None


def compressor_post(run, c, norm_weight, entry_ids, m: int, freqs, indexer: bool = False, qat: bool = True,
                    eps: float = NORM_EPS):
    """The model's `compressor_post` op (§5.5): raw entries c [..., d] at entry ids s → fp32 [..., d]."""
    if not qat or eps != NORM_EPS or 2 * freqs.shape[-1] != ROPE_DIM:
        raise Unsupported(f"compressor_post: the kernel is built for QAT on, eps {NORM_EPS} and {ROPE_DIM} RoPE "
                          f"dims; got qat {qat}, eps {eps}, {2 * freqs.shape[-1]} dims")
    d = c.shape[-1]
    rows = c.reshape(-1, d).float().contiguous()
    if not rows.shape[0]:
        return c.float().clone()
    inputs = {"c": rows, "norm_w": norm_weight.bfloat16().contiguous(),  # stored bf16: exact
              "table": rope_rows(entry_ids.reshape(-1).to(rows.device) * m, freqs.float().to(rows.device))}
    compiled = run.compiled({"op": "post", "m": m, "b": rows.shape[0], "d": d, "indexer": bool(indexer),
                             "dtype": "fp32"}, inputs)
    out = torch.empty_like(rows)
    compiled(rows, inputs["norm_w"], inputs["table"], out)
    return out.reshape(c.shape)


OPS = {"compressor_push": compressor_push, "compressor_post": compressor_post}
