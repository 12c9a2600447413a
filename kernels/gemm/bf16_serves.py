"""The model ops the bf16 GEMM serves (Family.serves of the gemm family; dsv4bench/model/kernel_ops.py):
the GEMMs on BF16 checkpoint weights, whose reference math is fp32 on bf16 values (spec §5.2, §6,
§9.1). fp32 tensors in and out, as the model works.

Where each part runs:

    op                  CuTeDSL kernels                                    torch
    lm_head             hc_head: mhc (op head, bf16 out); the final norm:  casts (exact: bf16 values)
                        rmsnorm (bf16 out); logits: the bf16 GEMM, fp32
    compressor_project  wkv and wgate as one bf16 GEMM (their rows          x -> bf16; + ape[t mod m]
                        stacked, made once per weight pair), fp32 out      (fp32, elementwise)
    indexer_weights     weights_proj: the bf16 GEMM, fp32 out              x -> bf16; x d^-0.5 H^-0.5

The activations go to the GEMM in bf16, as the reference's are (its activations are bf16: the
compressor's x.float() and the head's y.float() upcast bf16 values); the model's fp32 streams are
rounded to bf16 there, the one rounding the reference has too. The GEMM's products of two bf16
values are exact in fp32 and it accumulates in fp32: the result is the reference's fp32 product up
to summation order. Weights: stored bf16 in the checkpoint and passed as they are; a weight held in
another dtype is cast to bf16 once per weight (exact for bf16 values, a rounding otherwise). An
FP8 / FP4 `QuantWeight` here is Unsupported (the checkpoint has none), as is another eps than the
rmsnorm and mhc kernels are built for, and widths the kernels do not take (their own `supports`).
"""

from __future__ import annotations

import torch

from dsv4bench.core.registry import Unsupported
from kernels.common import Prepared
from oracles.indexer import head_weight_scale
from oracles.linear import QuantWeight
from oracles.norm import NORM_EPS
from sweeps.gemm import BF16

_WEIGHTS = Prepared(size=4096)  # bf16 (and stacked) weights: a whole model's


def _runner(family: str):
    """kernels/gemm/serves.py's kernel_runner, looked up at call time (that module imports this one;
    the CPU tests emulate the other families' kernels there)."""
    from kernels.gemm import serves

    return serves.kernel_runner(family)


def bf16_weight(w) -> torch.Tensor:
    """A model weight as the GEMM's W operand: bf16, contiguous, 16-byte aligned (made once per weight
    when it is not already)."""
    if isinstance(w, QuantWeight):
        raise Unsupported(f"the bf16 GEMM takes bf16 weights, not a {w.format} QuantWeight")
    if w.dtype == torch.bfloat16 and w.is_contiguous() and w.data_ptr() % 16 == 0:
        return w
    return _WEIGHTS.get((w,), lambda: w.to(torch.bfloat16, memory_format=torch.contiguous_format).clone())


def bf16_gemm_rows(run, rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [M, N] = rows (bf16 [M, K]) . w (bf16 [N, K])^T on the bf16 GEMM."""
    params = {"m": rows.shape[0], "n": w.shape[0], "k": w.shape[1], "op": BF16}
    return run(params, {"x": rows, "w": w})["out"]


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()


def lm_head(run, x, hc_fn, hc_scale, hc_base, norm_weight, head_weight, eps: float = NORM_EPS):
    """The model's `lm_head` op (also the MTP head): x [..., hc, D] final streams -> fp32 logits [..., V].
    hc_head on the mhc kernel (bf16 out, the reference's cast), the final RMSNorm on the rmsnorm
    kernel (bf16 out, as the reference's), the logits on the bf16 GEMM (fp32)."""
    if eps != NORM_EPS:
        raise Unsupported(f"lm_head: the mhc and rmsnorm kernels are built for eps {NORM_EPS}, not {eps}")
    lead, (hc, d) = x.shape[:-2], x.shape[-2:]
    streams = x.reshape(-1, hc, d).to(torch.bfloat16).contiguous()
    t = streams.shape[0]
    inputs = {"x": streams, "fn": hc_fn.float().contiguous(), "scale": hc_scale.float().contiguous(),
              "base": hc_base.float().contiguous()}
    y = _runner("mhc")({"op": "head", "t": t, "d": d, "dtype": "bf16"}, inputs)["y"]  # bf16 [T, D]
    norm = {"m": t, "n": d, "dtype": "bf16", "weight": True}
    y = _runner("rmsnorm")(norm, {"x": y, "w": norm_weight.to(torch.bfloat16).contiguous()})["out"]
    logits = bf16_gemm_rows(run, y.contiguous(), bf16_weight(head_weight))
    return logits.reshape(*lead, -1)


def _stacked(wkv, wgate) -> torch.Tensor:
    """[wkv; wgate] bf16 [2 coff*d, D]: both projections in one GEMM (one launch, x read once)."""
    for w in (wkv, wgate):
        if isinstance(w, QuantWeight):
            raise Unsupported(f"compressor_project: the bf16 GEMM takes bf16 weights, not a {w.format} QuantWeight")
    return _WEIGHTS.get((wkv, wgate), lambda: torch.cat((wkv.to(torch.bfloat16), wgate.to(torch.bfloat16))).contiguous())


def compressor_project(run, x, wkv, wgate, ape, positions):
    """The model's `compressor_project` op: (kv, score) fp32 [..., coff*d]; score includes ape[t mod m].
    kv is a column slice of the GEMM's output (a view, rows 2 coff*d apart)."""
    lead = x.shape[:-1]
    width = wkv.shape[0]
    out = bf16_gemm_rows(run, _rows(x), _stacked(wkv, wgate))
    kv, score = out[:, :width], out[:, width:]
    m = ape.shape[0]
    score = score + ape.float()[positions.reshape(-1).to(ape.device) % m]
    return kv.reshape(*lead, width), score.reshape(*lead, width)


def indexer_weights(run, x, weights_proj, head_dim: int = 128):
    """The model's `indexer_weights` op: fp32 [..., H_I] = weights_proj(x) * head_dim^-0.5 * H_I^-0.5 (the
    scale in torch, fp32)."""
    lead = x.shape[:-1]
    w = bf16_weight(weights_proj)
    out = bf16_gemm_rows(run, _rows(x), w)
    return (out * head_weight_scale(w.shape[0], head_dim)).reshape(*lead, -1)


OPS = {"lm_head": lm_head, "compressor_project": compressor_project, "indexer_weights": indexer_weights}
