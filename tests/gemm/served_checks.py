"""What the served-op tests share (kernels/gemm/serves.py; CPU with the kernels emulated, GPU on the
kernels): fresh random arguments of q_projection / kv_projection / output_projection as the model
passes them, and the pass rule.

The rule, derived from FP8 quantisation: every linear quantises its activation to e4m3 (3 mantissa
bits: ~2-3% relative error per linear), which the FP32 oracle does not, so the harness's 1e-2
relative-L2 bar cannot hold. An output passes when it is finite and within `RATIO` times the error
of the op's low-precision reference (the same quantisations, in the reference's op order), in max
abs (+ one bf16 ulp of the largest oracle value) and in relative L2: the harness rule with the
reference's own relative error as the L2 bar. The references: oracles/projections.py's
q_projection_lowprec and kv_projection_lowprec, and oracles/attention.py's output_projection_lowprec
(wo_a in a bf16 einsum, as the adapter serves it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsv4bench.model.dispatch import OPS
from oracles.attention import output_projection_lowprec
from oracles.linear import QuantWeight
from oracles.norm import NORM_EPS
from oracles.projections import kv_projection_lowprec, q_projection_lowprec
from oracles.quant import quant_fp8_weight
from oracles.rope import rope_config_for_ratio, rope_freqs

RATIO = 2.0
HEAD_DIM = 512


@dataclass(frozen=True)
class Dims:
    dim: int
    q_lora: int
    heads: int
    groups: int
    o_lora: int


# q_lora 384 = 3 K blocks (the GEMM pads its weight scales to TMA boxes); 2 groups of 2 heads
SMALL = Dims(dim=256, q_lora=384, heads=4, groups=2, o_lora=128)
FLASH = Dims(dim=4096, q_lora=1024, heads=64, groups=8, o_lora=1024)
PRO = Dims(dim=7168, q_lora=1536, heads=128, groups=16, o_lora=1024)


def _weight(out_f: int, in_f: int, gen, device) -> QuantWeight:
    """An FP8 checkpoint weight (e4m3 codes, E8M0 128 x 128 block scales) of variance ~1/in."""
    codes, scale = quant_fp8_weight(torch.randn(out_f, in_f, generator=gen) * in_f**-0.5)
    return QuantWeight(codes.to(device), scale.to(device))


def _norm_weight(n: int, gen, device) -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(n, generator=gen)).bfloat16().float().to(device)  # stored bf16


def op_args(op: str, dims: Dims, tokens: int, seed: int, device: str, decode: bool = False, qat: bool = True):
    """(args, kwargs) of one call of `op` on `tokens` rows: fresh random inputs; positions 0.. for a
    prefill, scattered up to 64k for decode rows; the compressed layers' (YaRN) RoPE table."""
    gen = torch.Generator().manual_seed(seed)
    positions = (torch.randint(0, 1 << 16, (tokens,), generator=gen) if decode else torch.arange(tokens)).to(device)
    freqs = rope_freqs(rope_config_for_ratio(4)).to(device)
    if op == "output_projection":
        o = torch.randn(tokens, dims.heads, HEAD_DIM, generator=gen).to(device)
        k = dims.heads // dims.groups * HEAD_DIM
        wo_a = _weight(dims.groups * dims.o_lora, k, gen, device)
        wo_b = _weight(dims.dim, dims.groups * dims.o_lora, gen, device)
        return (o, positions, freqs, wo_a, wo_b, dims.groups), {}
    rows = torch.exp2(torch.randint(-2, 3, (tokens, 1), generator=gen).float())  # rows of different magnitudes
    x = (torch.randn(tokens, dims.dim, generator=gen) * rows).to(device)
    if op == "q_projection":
        return (x, _weight(dims.q_lora, dims.dim, gen, device), _norm_weight(dims.q_lora, gen, device),
                _weight(dims.heads * HEAD_DIM, dims.q_lora, gen, device), dims.heads, positions, freqs, NORM_EPS), {}
    return (x, _weight(HEAD_DIM, dims.dim, gen, device), _norm_weight(HEAD_DIM, gen, device), positions, freqs,
            NORM_EPS), {"qat": qat}


LOWPREC = {"q_projection": q_projection_lowprec, "kv_projection": kv_projection_lowprec,
           "output_projection": output_projection_lowprec}


def as_tuple(v) -> tuple:
    """An op's outputs as a tuple (q_projection returns two)."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def errors(op: str, out, args, kwargs) -> list[dict]:
    """Per output: max abs and relative L2 error against the oracle, of `out` and of the reference."""
    oracle, low = OPS[op].oracle(*args, **kwargs), LOWPREC[op](*args, **kwargs)
    rows = []
    for o, r, lp in zip(as_tuple(out), as_tuple(oracle), as_tuple(low)):
        o, r, lp = o.cpu().double(), r.cpu().double(), lp.cpu().double()
        assert o.shape == r.shape, (o.shape, r.shape)
        top = float(r.abs().max())
        rows.append({"finite": bool(torch.isfinite(o).all()), "max": float((o - r).abs().max()),
                     "low_max": float((lp - r).abs().max()), "rel": float((o - r).norm() / r.norm()),
                     "low_rel": float((lp - r).norm() / r.norm()), "ulp": 2.0 ** (math.floor(math.log2(top)) - 7)})
    return rows


def passes(row: dict) -> bool:
    return (row["finite"] and row["max"] <= RATIO * row["low_max"] + row["ulp"]
            and row["rel"] <= RATIO * row["low_rel"])


def assert_passes(op: str, out, args, kwargs) -> None:
    for row in errors(op, out, args, kwargs):
        assert passes(row), f"{op}: {row}"
