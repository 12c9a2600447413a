"""The model op this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py):
`compressor_prefill`, the main compressor's pooling + post-processing of a prefill from position 0
(CSA m = 4 and HCA m = 128), in one launch. fp32 projections in, fp32 math, the entries written bf16
(the NoPE dims are FP8 values, exact in bf16; the RoPE dims rounded once), returned as fp32.

Not served, raising Unsupported: the indexer's compressor (its post-processing is Hadamard + FP4,
the kernel's is the FP8 NoPE round trip), QAT off (the kernel always quantises the NoPE dims),
another eps or RoPE width. The decode-time ops (`compressor_push`, `compressor_post`) are not the
kernel's: it pools whole blocks of a sequence from position 0."""

from __future__ import annotations

import torch

from dsv4bench.core.registry import Unsupported
from kernels.rope.rotate import ROPE_DIM, rope_table
from oracles.compressor import num_entries
from oracles.norm import NORM_EPS


def compressor_prefill(run, kv, score, norm_weight, m: int, freqs, indexer: bool = False, qat: bool = True,
                       eps: float = NORM_EPS):
    """The model's `compressor_prefill` op: kv, score fp32 [B, S, coff·d] → entries fp32 [B, ⌊S/m⌋, d]."""
    if indexer:
        raise Unsupported("compressor_prefill: the kernel's post-processing is the main compressor's FP8 NoPE "
                          "round trip, not the indexer's Hadamard + FP4")
    if not qat or eps != NORM_EPS or 2 * freqs.shape[-1] != ROPE_DIM:
        raise Unsupported(f"compressor_prefill: the kernel is built for QAT on, eps {NORM_EPS} and {ROPE_DIM} RoPE "
                          f"dims; got qat {qat}, eps {eps}, {2 * freqs.shape[-1]} dims")
    b, s, _ = kv.shape
    n = num_entries(s, m)
    d = norm_weight.shape[-1]
    inputs = {"kv": kv.float().contiguous(), "score": score.float().contiguous(),
              "norm_w": norm_weight.bfloat16().contiguous(),  # stored bf16: exact
              "table": rope_table(freqs.float(), max(1, (n - 1) * m + 1), kv.device)}
    out = run({"m": m, "b": b, "s": s, "d": d, "dtype": "bf16"}, inputs)
    return torch.cat((out["nope"], out["rope"]), dim=-1).float()


OPS = {"compressor_prefill": compressor_prefill}
