"""The model ops the FP8 GEMM serves (Family.serves; dsv4bench/model/kernel_ops.py): the attention
projections, whose math is FP8 linears plus norms and RoPE. fp32 tensors in and out, as the model
works; bf16 in between, as the reference runs them (spec §2.6, §4, §7.3-7.4).

Where each part runs:

    op                 CuTeDSL kernels                                        torch
    q_projection       wq_a, wq_b: quant+gemm; q_norm: rmsnorm; the per-      the RoPE table rows of the
                       head norm + RoPE: rope (q_norm_rope)                    call's positions; casts
    kv_projection      wkv: quant+gemm; kv_norm: rmsnorm; RoPE: rope;         the table rows; the QAT
                       QAT FP8 codes of the 448 NoPE dims: quant (block 64)   codes x scales (exact)
    output_projection  inverse RoPE: rope (inverse); wo_a: the bf16 GEMM,      the table rows; casts;
                       grouped, one launch; wo_b: quant+gemm                   wo_a dequantised once
    indexer_queries    wq_b: quant+gemm; RoPE: rope; Hadamard + MXFP4: quant  codes x scales (exact)
    mtp_input          enorm, hnorm: rmsnorm; e_proj, h_proj: quant+gemm      the embedding rows; the
                                                                              broadcast sum (fp32)

Every FP8 linear quantises its bf16 input per 128 columns with the ue8m0 rule and accumulates in
fp32 (bf16 out): the reference's act_quant + fp8_gemm. wo_a runs as the reference runs it, a bf16
einsum on the dequantised weight (the bf16 GEMM's grouped mode): FP8 wo_a (the gemm family's grouped
FP8 mode, as vLLM serves it) quantised one activation more than the reference and left the kernel
model's residual outside the low-precision model's (4.81e-2 vs 4.44e-2 after four Flash layers, issue
#24). One departure from the reference's low-precision path: the per-head q norm runs in fp32 inside
the rope kernel where the reference computes it in bf16.

Weights: the model passes the checkpoint's `QuantWeight`s (e4m3 codes + E8M0 128 x 128 block scales,
dsv4bench/model/weights.py); the codes go to the GEMM as they are and the scales are decoded to fp32
once per weight. A plain tensor (a dequantised weight) is quantised to e4m3 per 128 x 128 block once
per weight: exact when it came from FP8 with power-of-two scales (every value is code x 2^e, and the
ue8m0 rule's scale for its block is 2^e or a smaller power of two, which shifts exponents only), an
FP8 rounding otherwise. What the kernels do not take raises Unsupported: K not a multiple of 128
(the tiny config's width 64), wo_a groups of o_lora rows not whole 64-row tiles, MXFP4 / NVFP4
weights, another eps or RoPE width than the kernels are built for.
"""

from __future__ import annotations

import functools

import torch

from dsv4bench.core.registry import Unsupported, get_family
from kernels.common import Prepared
from kernels.rmsnorm.serves import rmsnorm
from kernels.rope.rotate import ROPE_DIM, rope_rows
from oracles.compressor import INDEXER_FP4_BLOCK
from oracles.linear import QuantWeight, Weight, dequant
from oracles.norm import NORM_EPS
from oracles.projections import KV_QAT_BLOCK
from oracles.quant import fp8_block_dequant, mxfp4_dequant, quant_fp8_weight, ue8m0_decode, unpack_fp4
from sweeps.gemm import BF16, QUANT_GEMM
from sweeps.quant import fp8 as quant_case
from sweeps.quant import mxfp4 as mxfp4_case

_WEIGHTS = Prepared(size=4096)  # fp32 scales (and a plain weight's codes) per weight: a whole model's


@functools.cache
def kernel_runner(family: str):
    """`run(params, inputs)` of another family's CuTeDSL kernel (compiled once per compile key)."""
    from dsv4bench.model.kernel_ops import KernelOp

    return KernelOp(get_family(family), f"{family} (in a gemm adapter)", None).run


def fp8_weight(w: Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [N, K], fp32 scales [ceil(N/128), ceil(K/128)]) of a model weight, made once per weight."""
    if not isinstance(w, QuantWeight):
        return _WEIGHTS.get((w,), lambda: _requantised(w))
    if w.format != "fp8":
        raise Unsupported(f"the FP8 GEMM takes FP8 weights, not {w.format}")
    return w.weight.contiguous(), _WEIGHTS.get((w.scale,), lambda: _fp32(w.scale))


def _requantised(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scale = quant_fp8_weight(w)
    return codes, _fp32(scale)


def _fp32(scale: torch.Tensor) -> torch.Tensor:
    return (ue8m0_decode(scale) if scale.dtype == torch.float8_e8m0fnu else scale.float()).contiguous()


def fp8_linear(run, x: torch.Tensor, w: Weight, groups: int = 1) -> torch.Tensor:
    """bf16 [rows, N] = act_quant(x) . W^T (grouped: blockdiag(W)) on quant+gemm; x [..., groups*K]."""
    codes, scales = fp8_weight(w)
    rows = x.reshape(-1, x.shape[-1]).bfloat16().contiguous()
    params = {"m": rows.shape[0], "n": codes.shape[0], "k": codes.shape[1], "groups": groups, "op": QUANT_GEMM}
    return run(params, {"x": rows, "w": codes, "sw": scales})["out"]


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, op: str) -> torch.Tensor:
    """The rope kernel (op: q_norm_rope, rope or inverse) on bf16 x [T, H, n]; positions: one per token."""
    if 2 * freqs.shape[-1] != ROPE_DIM:
        raise Unsupported(f"the rope kernel rotates {ROPE_DIM} dims, not {2 * freqs.shape[-1]}")
    t, h, n = x.shape
    params = {"op": op, "t": t, "h": h, "n": n, "dtype": "bf16"}
    inputs = {"x": x.contiguous(), "positions": torch.arange(t, dtype=torch.int32, device=x.device),
              "table": rope_rows(positions.expand(t).to(x.device), freqs.float().to(x.device))}
    return kernel_runner("rope")(params, inputs)["out"]


def _check_eps(eps: float) -> None:
    if eps != NORM_EPS:
        raise Unsupported(f"the rmsnorm and rope kernels are built for eps {NORM_EPS}, not {eps}")


def q_projection(run, x, wq_a: Weight, q_norm_weight, wq_b: Weight, n_heads: int, positions, freqs,
                 eps: float = NORM_EPS):
    """The model's `q_projection` op: (q fp32 [..., H, hd], qr fp32 [..., q_lora])."""
    _check_eps(eps)
    lead = x.shape[:-1]
    qr = rmsnorm(kernel_runner("rmsnorm"), fp8_linear(run, x, wq_a), q_norm_weight, eps)  # fp32 of bf16
    q = fp8_linear(run, qr, wq_b).unflatten(-1, (n_heads, -1))
    q = rope(q, positions.reshape(-1), freqs, "q_norm_rope")
    return q.float().reshape(*lead, n_heads, -1), qr.reshape(*lead, -1)


def kv_projection(run, x, wkv: Weight, kv_norm_weight, positions, freqs, eps: float = NORM_EPS, qat: bool = True):
    """The model's `kv_projection` op: the shared K = V latent, fp32 [..., 512]."""
    _check_eps(eps)
    lead = x.shape[:-1]
    kv = rmsnorm(kernel_runner("rmsnorm"), fp8_linear(run, x, wkv), kv_norm_weight, eps).bfloat16()
    kv = rope(kv.unsqueeze(1), positions.reshape(-1), freqs, "rope")[:, 0]
    if qat:
        kv = torch.cat((nope_fp8_qdq(kv[:, :-ROPE_DIM]), kv[:, -ROPE_DIM:]), dim=-1)
    return kv.float().reshape(*lead, -1)


def nope_fp8_qdq(nope: torch.Tensor) -> torch.Tensor:
    """The QAT round trip of the NoPE dims (bf16 [T, 448], a column slice of the kv rows): the quant
    kernel's e4m3 codes and ue8m0 scales per 64, dequantised in torch (exact in bf16)."""
    t, n = nope.shape
    out = kernel_runner("quant")(quant_case(t, n, KV_QAT_BLOCK, nope.stride(0)), {"x": nope})
    return fp8_block_dequant(out["codes"].view(torch.float8_e4m3fn), ue8m0_decode(out["scales"]),
                             KV_QAT_BLOCK).bfloat16()


def output_projection(run, o, positions, freqs, wo_a: Weight, wo_b: Weight, n_groups: int):
    """The model's `output_projection` op: o [..., H, 512] -> fp32 [..., D]. wo_a as the reference runs
    it: its bf16 einsum on the dequantised weight (the bf16 GEMM's grouped mode, one launch, fp32
    accumulation, the result rounded to bf16 as the einsum's is); wo_b on quant+gemm."""
    lead, (h, d) = o.shape[:-2], o.shape[-2:]
    rows = o.reshape(-1, h, d).bfloat16()
    rows = rope(rows, positions.reshape(-1), freqs, "inverse")
    wa = bf16_dequantised(wo_a)
    params = {"m": rows.shape[0], "n": wa.shape[0], "k": wa.shape[1], "groups": n_groups, "op": BF16}
    u = run(params, {"x": rows.view(-1, h * d), "w": wa})["out"].bfloat16()
    return fp8_linear(run, u, wo_b).float().reshape(*lead, -1)


def bf16_dequantised(w: Weight) -> torch.Tensor:
    """A weight as bf16 [N, K], made once per weight (convert.py's dequantisation of wo_a: exact for FP8
    codes times power-of-two scales, which bf16's 8 significant bits and wide exponent hold)."""
    sources = (w.weight, w.scale) if isinstance(w, QuantWeight) else (w,)
    return _WEIGHTS.get(sources, lambda: dequant(w).bfloat16().contiguous())


def indexer_queries(run, qr, wq_b: Weight, n_heads: int, positions, freqs, qat: bool = True):
    """The model's `indexer_queries` op: fp32 [..., H_I, 128], the FP4 round trip of the Hadamard-rotated
    queries. Without QAT the op is the rotation alone, which no kernel returns (the quant kernel writes
    MXFP4 codes): Unsupported."""
    if not qat:
        raise Unsupported("indexer_queries: the quant kernel rotates only into MXFP4 codes; qat off needs the "
                          "bf16 rotation")
    lead = qr.shape[:-1]
    q = fp8_linear(run, qr, wq_b).unflatten(-1, (n_heads, -1))
    q = rope(q, positions.reshape(-1), freqs, "rope").reshape(-1, q.shape[-1])
    out = kernel_runner("quant")(mxfp4_case(q.shape[0], q.shape[1]), {"x": q})
    deq = mxfp4_dequant(unpack_fp4(out["codes"]), out["scales"], INDEXER_FP4_BLOCK)  # e2m1 x 2^e: exact
    return deq.reshape(*lead, n_heads, -1)


def mtp_input(run, x, next_ids, embed_weight, enorm_weight, hnorm_weight, e_proj: Weight, h_proj: Weight,
              eps: float = NORM_EPS):
    """The model's `mtp_input` op: fp32 [..., hc, D] = e_proj(enorm(embed)) + h_proj(hnorm(x)), each GEMM
    bf16 out as the reference's; the broadcast sum in fp32 (the reference's is in bf16)."""
    _check_eps(eps)
    norm = kernel_runner("rmsnorm")
    e = fp8_linear(run, rmsnorm(norm, embed_weight[next_ids], enorm_weight, eps), e_proj)
    h = fp8_linear(run, rmsnorm(norm, x, hnorm_weight, eps), h_proj)
    return e.float().reshape(*next_ids.shape, 1, -1) + h.float().reshape(x.shape[:-1] + (-1,))


OPS = {"q_projection": q_projection, "kv_projection": kv_projection, "output_projection": output_projection,
       "indexer_queries": indexer_queries, "mtp_input": mtp_input}
