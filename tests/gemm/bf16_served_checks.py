"""What the tests of the ops on the bf16 GEMM share (kernels/gemm/bf16_serves.py: lm_head,
compressor_project, indexer_weights; CPU with the kernels emulated, GPU on the kernels): fresh random
arguments as the model passes them, and two pass rules.

* `assert_passes`: against the op's FP32 oracle, within RATIO times the error of the reference's
  low-precision path (lm_logits_lowprec: hc_head and the norm rounded to bf16; the compressor and
  weights_proj on bf16 activations), in max abs (+ one bf16 ulp of the largest oracle value) and
  relative L2: the harness rule with the reference's own error as the bar. The reference's streams
  and activations are bf16: the fp32 arguments are rounded to bf16 for it.
* `assert_summation_order_close`: compressor_project and indexer_weights against the FP32 oracle of
  the reference's own operands (the activations rounded to bf16, as the reference's are), which the
  bf16 GEMM computes up to summation order: relative L2 <= 1e-4 and every element within
  2 K 2^-24 (|x| . |W|^T), the worst case of any fp32 summation order for both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oracles.compressor import compressor_project as compressor_project_oracle
from oracles.head import lm_logits, lm_logits_lowprec
from oracles.indexer import head_weight_scale, indexer_weights as indexer_weights_oracle, indexer_weights_lowprec
from oracles.mhc import HC_MULT

RATIO = 2.0


@dataclass(frozen=True)
class Widths:
    dim: int
    vocab: int


SMALL = Widths(dim=256, vocab=1000)
FLASH = Widths(dim=4096, vocab=129280)
PRO = Widths(dim=7168, vocab=129280)
# (ratio m, projection width coff*d): CSA, HCA, the indexer's compressor
COMPRESSORS = {"csa": (4, 1024), "hca": (128, 512), "indexer": (4, 256)}
INDEX_HEADS, INDEX_HEAD_DIM = 64, 128


def _gen(seed: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _bf16_weight(n: int, k: int, gen, device) -> torch.Tensor:
    """A BF16 checkpoint weight of variance ~1/k (outputs O(1))."""
    return (torch.randn(n, k, generator=gen, device=device) * k**-0.5).bfloat16()


def op_args(op: str, w: Widths, tokens: int, seed: int, device: str, compressor: str = "csa",
            start: int = 0) -> tuple:
    """The positional arguments of one call of `op` on `tokens` rows."""
    gen = _gen(seed, device)
    d = w.dim
    if op == "lm_head":
        x = torch.randn(tokens, HC_MULT, d, generator=gen, device=device) * 3.0 + 0.25
        fn = torch.randn(HC_MULT, HC_MULT * d, generator=gen, device=device) * (HC_MULT * d) ** -0.5
        scale = 0.5 + torch.rand(1, generator=gen, device=device)
        base = 0.5 * torch.randn(HC_MULT, generator=gen, device=device)
        norm = (1.0 + 0.1 * torch.randn(d, generator=gen, device=device)).bfloat16().float()
        return x, fn, scale, base, norm, _bf16_weight(w.vocab, d, gen, device)
    x = torch.randn(tokens, d, generator=gen, device=device) * 2.0
    if op == "compressor_project":
        m, width = COMPRESSORS[compressor]
        ape = 0.1 * torch.randn(m, width, generator=gen, device=device)
        positions = torch.arange(start, start + tokens, device=device)
        return x, _bf16_weight(width, d, gen, device), _bf16_weight(width, d, gen, device), ape, positions
    if op == "indexer_weights":
        return x, _bf16_weight(INDEX_HEADS, d, gen, device), INDEX_HEAD_DIM
    raise ValueError(op)


def oracle(op: str, args: tuple):
    return {"lm_head": lm_logits, "compressor_project": compressor_project_oracle,
            "indexer_weights": indexer_weights_oracle}[op](*args)


def lowprec(op: str, args: tuple):
    """The reference's path: its bf16 roundings, its fp32 products."""
    x = args[0].bfloat16()  # the reference's streams and activations are bf16
    if op == "lm_head":
        return lm_logits_lowprec(x, *args[1:])
    if op == "compressor_project":
        return compressor_project_oracle(x, *args[1:])
    return indexer_weights_lowprec(x, *args[1:])


def assert_passes(op: str, out, args: tuple) -> None:
    truth, ref = oracle(op, args), lowprec(op, args)
    assert isinstance(out, tuple) == isinstance(truth, tuple)
    for o, t, r in zip(*(v if isinstance(v, tuple) else (v,) for v in (out, truth, ref))):
        assert o.shape == t.shape and o.dtype == torch.float32, (o.shape, t.shape, o.dtype)
        o, t, r = o.double().cpu(), t.double().cpu(), r.double().cpu()
        assert torch.isfinite(o).all(), f"{op}: non-finite output"
        ulp = 2.0 ** (torch.frexp(t.abs().max().float())[1].item() - 8)
        bar = RATIO * (r - t).abs().max().item() + ulp
        err = (o - t).abs().max().item()
        assert err <= bar, f"{op}: max |out - oracle| {err:.3g} > {bar:.3g} (2x the reference's + 1 bf16 ulp)"
        rel, rel_ref = ((o - t).norm() / t.norm()).item(), ((r - t).norm() / t.norm()).item()
        assert rel <= RATIO * rel_ref + 1e-6, f"{op}: rel L2 {rel:.3g} > 2x the reference's {rel_ref:.3g}"


def assert_summation_order_close(op: str, out, args: tuple) -> None:
    """compressor_project / indexer_weights against the oracle of the reference's bf16 activations."""
    x = args[0].bfloat16().float()
    w_abs = (args[1].float().abs(),) if op == "indexer_weights" else (args[1].float().abs(), args[2].float().abs())
    truth = oracle(op, (x, *args[1:]))
    truth = truth if isinstance(truth, tuple) else (truth,)
    out = out if isinstance(out, tuple) else (out,)
    k = x.shape[-1]
    scale = head_weight_scale(INDEX_HEADS, INDEX_HEAD_DIM) if op == "indexer_weights" else 1.0
    for i, (o, t, wa) in enumerate(zip(out, truth, w_abs)):
        assert o.shape == t.shape and o.dtype == torch.float32, (o.shape, t.shape, o.dtype)
        o, t = o.double().cpu(), t.double().cpu()
        bound = (2 * k * 2.0**-24 * scale * (x.abs() @ wa.T)).double().cpu() + 1e-30
        bound = bound + 2.0**-23 * t.abs()  # + ape (the compressor's score) or x scale: one fp32 rounding  # + ape, one fp32 add
        bad = (o - t).abs() > bound
        assert not bad.any(), f"{op}: {int(bad.sum())} elements outside the summation-order bound"
        rel = ((o - t).norm() / t.norm()).item()
        assert rel <= 1e-4, f"{op}: rel L2 {rel:.3g} against the oracle of its own bf16 operands"
