"""Fresh random arguments of the ops served outside the projections (indexer_queries, mtp_input,
compressor_prefill, sample), as the model passes them, and their low-precision references; the pass
rule is tests/gemm/served_checks.py's (within 2x the error of the op's low-precision reference, against
the FP32 oracle). Shared by test_served_ops_cpu.py (kernels emulated) and test_served_ops_gpu.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bench.model.lowprec_ops import compressor_prefill_lowprec, indexer_scores_bf16
from oracles.head import mtp_input_lowprec
from oracles.indexer import indexer_queries_lowprec
from oracles.rope import rope_config_for_ratio, rope_freqs
from tests.gemm import served_checks as sc

LOWPREC = {"indexer_queries": indexer_queries_lowprec, "mtp_input": mtp_input_lowprec,
           "compressor_prefill": compressor_prefill_lowprec, "indexer_scores": indexer_scores_bf16}


@dataclass(frozen=True)
class Widths:
    dim: int
    q_lora: int
    index_heads: int
    vocab: int


SMALL = Widths(dim=256, q_lora=384, index_heads=4, vocab=300)
FLASH = Widths(dim=4096, q_lora=1024, index_heads=64, vocab=129280)
HC = 4
INDEX_HEAD_DIM = 128
ENTRY = 512  # the main compressor's entry width (head_dim)
ROPE_PAIRS = 32  # the 64 RoPE dims, as complex pairs


def op_args(op: str, w: Widths, tokens: int, seed: int, device: str, batch: int = 1, ratio: int = 4):
    """(args, kwargs) of one call: `tokens` rows (compressor_prefill: `batch` sequences of `tokens`)."""
    gen = torch.Generator().manual_seed(seed)
    freqs = rope_freqs(rope_config_for_ratio(4)).to(device)
    if op == "indexer_queries":
        positions = torch.randint(0, 1 << 16, (tokens,), generator=gen).to(device)
        qr = (torch.randn(tokens, w.q_lora, generator=gen) * 2.0).to(device)
        wq_b = sc._weight(w.index_heads * INDEX_HEAD_DIM, w.q_lora, gen, device)
        return (qr, wq_b, w.index_heads, positions, freqs), {"qat": True}
    if op == "mtp_input":
        vocab = min(w.vocab, 4096)  # the rows the ids pick are what matters
        x = (torch.randn(tokens, HC, w.dim, generator=gen) * 3.0).to(device)
        ids = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
        embed = torch.randn(vocab, w.dim, generator=gen).bfloat16().to(device)
        return (x, ids, embed, sc._norm_weight(w.dim, gen, device), sc._norm_weight(w.dim, gen, device),
                sc._weight(w.dim, w.dim, gen, device), sc._weight(w.dim, w.dim, gen, device)), {}
    if op == "compressor_prefill":
        width = ENTRY * (2 if ratio == 4 else 1)
        kv = torch.randn(batch, tokens, width, generator=gen).to(device)
        score = (2.0 * torch.randn(batch, tokens, width, generator=gen) + 0.5).to(device)
        freqs = rope_freqs(rope_config_for_ratio(ratio)).to(device)
        return (kv, score, sc._norm_weight(ENTRY, gen, device), ratio, freqs), {"indexer": False, "qat": True}
    raise ValueError(op)


def indexer_operands(batch: int, seqlen: int, n: int, seed: int, device: str, heads: int = 64):
    """FP4-simulated, Hadamard-rotated queries [B, S, H, 128] and keys [B, N, 128] (the model's, QAT
    on; keys of varied norms) and per-head weights [B, S, H]."""
    from oracles.hadamard import hadamard_rotate
    from oracles.quant import fp4_qdq

    gen = torch.Generator().manual_seed(seed)
    q = fp4_qdq(hadamard_rotate(torch.randn(batch, seqlen, heads, INDEX_HEAD_DIM, generator=gen) * 3), 32)
    mag = torch.exp2(torch.randint(-3, 3, (batch, n, 1), generator=gen).float())
    k = fp4_qdq(hadamard_rotate(torch.randn(batch, n, INDEX_HEAD_DIM, generator=gen) * mag), 32)
    w = torch.randn(batch, seqlen, heads, generator=gen) * 0.011
    return q.to(device), k.to(device), w.to(device)


def sample_args(rows: int, vocab: int, seed: int, device: str):
    """bf16-rounded logits (ties at the maximum are common) [rows, V], or [V] for one row."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * 2.0).bfloat16().float().to(device)
    return logits[0] if rows == 1 else logits


def assert_passes(op: str, out, args, kwargs, monkeypatch) -> None:
    monkeypatch.setitem(sc.LOWPREC, op, LOWPREC[op])
    sc.assert_passes(op, out, args, kwargs)
