"""The model op this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py):
`compressor_prefill`, a compressor's pooling + post-processing of a prefill from position 0, in one
launch: the main compressor (CSA m = 4 and HCA m = 128; the entries' NoPE dims FP8 values, exact in
bf16, the RoPE dims rounded once) and, with `indexer=True`, the indexer's (m = 4, d = 128: Hadamard +
FP4 qdq, kernels/compressor/indexer.py; FP4 values times a power-of-two scale, exact in bf16). fp32
projections in, fp32 math, the entries written bf16, returned as fp32.

Not served, raising Unsupported: QAT off (the kernel always quantises), another eps or RoPE width, the
indexer's post-processing at another width than 128 or ratio than 4. The decode-time ops
(`compressor_push`, `compressor_post`) are not this kernel's: it pools whole blocks of a sequence
from position 0."""

from __future__ import annotations

import torch

from dsv4bench.core.registry import Unsupported
from kernels.compressor_decode.decode import INDEXER_D
from kernels.rope.rotate import ROPE_DIM, rope_table
from oracles.compressor import CSA_RATIO, num_entries
from oracles.norm import NORM_EPS


def compressor_prefill(run, kv, score, norm_weight, m: int, freqs, indexer: bool = False, qat: bool = True,
                       eps: float = NORM_EPS):
    """The model's `compressor_prefill` op: kv, score fp32 [B, S, coff·d] → entries fp32 [B, ⌊S/m⌋, d]."""
    d = norm_weight.shape[-1]
    if indexer and (d != INDEXER_D or m != CSA_RATIO):
        raise Unsupported(f"compressor_prefill: the indexer's Hadamard + FP4 post-processing is built for "
                          f"d = {INDEXER_D}, m = {CSA_RATIO}; got d = {d}, m = {m}")
    if not qat or eps != NORM_EPS or 2 * freqs.shape[-1] != ROPE_DIM:
        raise Unsupported(f"compressor_prefill: the kernel is built for QAT on, eps {NORM_EPS} and {ROPE_DIM} RoPE "
                          f"dims; got qat {qat}, eps {eps}, {2 * freqs.shape[-1]} dims")
    b, s, _ = kv.shape
    n = num_entries(s, m)
    if n == 0:  # a prompt shorter than one block: nothing to compress, and no launch (the kernel takes n >= 1)
        return kv.new_empty(b, 0, d, dtype=torch.float32)
    inputs = {"kv": kv.float().contiguous(), "score": score.float().contiguous(),
              "norm_w": norm_weight.bfloat16().contiguous(),  # stored bf16: exact
              "table": rope_table(freqs.float(), max(1, (n - 1) * m + 1), kv.device)}
    if indexer:
        return run({"m": m, "b": b, "s": s, "d": d, "indexer": True, "dtype": "bf16"}, inputs)["out"].float()
    out = run({"m": m, "b": b, "s": s, "d": d, "dtype": "bf16"}, inputs)
    return torch.cat((out["nope"], out["rope"]), dim=-1).float()


OPS = {"compressor_prefill": compressor_prefill}
