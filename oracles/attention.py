"""Core attention of a DSV4 layer (docs/model-math.md §7): key index sets, softmax with sink,
inverse RoPE on the output, grouped low-rank output projection.

The softmax-with-sink core is `oracles.fmha.sparse_attention` (§7.2); this module builds what
surrounds it. Every head attends over the same 512-dim kv rows (K = V, MQA) with scale 512^-0.5.
Key sets (§7.1): window = positions max(0, t−127)..t; compressed = none (SWA), every visible entry
(HCA), or the indexer's top-k (CSA).

Two index encodings exist in the reference:
* prefill: kv_all = cat(raw_kv[0:S], compressed[0:⌊S/m⌋]), entry s at row S + s (`layer_key_indices`);
* decode: cache [128 + n_entries, 512], window ring slot p mod 128, entry s at 128 + s
  (`decode_cache`, `decode_key_indices`).
"""

from __future__ import annotations

import torch

from oracles.compressor import visible_entries
from oracles.fmha import dsv4_indices, hca_compressed, sparse_attention, sparse_attention_lowprec
from oracles.linear import Weight, dequant, linear, linear_lowprec
from oracles.rope import apply_rope, apply_rope_lowprec

WINDOW = 128
HEAD_DIM = 512
SOFTMAX_SCALE = HEAD_DIM**-0.5


# ---------------------------------------------------------------- §7.1 key index sets

def layer_key_indices(seqlen: int, ratio: int, selected: torch.Tensor | None = None,
                      window: int = WINDOW) -> torch.Tensor:
    """Prefill key indices into kv_all = cat(raw[0:S], compressed[0:⌊S/m⌋]): int32 [S, n], −1 = none.

    ratio 0: window only; ratio 128 (HCA): window + all s < ⌊(t+1)/m⌋; ratio 4 (CSA): window +
    `selected` [S, k] (local entry ids from `oracles.indexer.indexer_topk`, −1 = none).
    """
    if ratio == 0:
        return dsv4_indices(seqlen, window, None, 0)
    compressed = hca_compressed(seqlen, ratio) if selected is None else selected
    return dsv4_indices(seqlen, window, compressed, seqlen // ratio)


def decode_cache(raw_kv: torch.Tensor, compressed: torch.Tensor | None, t: int, window: int = WINDOW) -> torch.Tensor:
    """The reference decode cache after token t (§10.1): [B, window + N, d].

    raw_kv: [B, ≥ t+1, d] window rows by position; compressed: [B, N, d] or None. Ring slot
    p mod window holds the newest position p ≤ t; slots never written stay zero.
    """
    batch, _, d = raw_kv.shape
    ring = raw_kv.new_zeros(batch, window, d)
    for p in range(max(0, t - window + 1), t + 1):
        ring[:, p % window] = raw_kv[:, p]
    return ring if compressed is None else torch.cat((ring, compressed.to(ring.dtype)), dim=1)


def decode_key_indices(t: int, ratio: int, selected: torch.Tensor | None = None, window: int = WINDOW) -> torch.Tensor:
    """Decode key indices of the query at position t into `decode_cache`: int64 [n], −1 = none.

    Window ring slots of positions max(0, t−window+1)..t, then window + s for the compressed entries
    (HCA: s < ⌊(t+1)/m⌋; CSA: `selected` [k] local entry ids, −1 = none; SWA: none).
    """
    device = None if selected is None else selected.device
    positions = torch.arange(t - window + 1, t + 1, device=device)
    win = torch.where(positions >= 0, positions % window, torch.full_like(positions, -1))
    if ratio == 0:
        return win
    entries = torch.arange(visible_entries(t, ratio), device=device) if selected is None else selected.long()
    return torch.cat((win, torch.where(entries >= 0, entries + window, torch.full_like(entries, -1))))


# ---------------------------------------------------------------- §7.2 softmax with sink

def attention_core(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor,
                   scale: float = SOFTMAX_SCALE, lowprec: bool = False):
    """§7.2 per batch row: q [B, S, H, 512], kv [B, N, 512], indices [B, S, n] or [S, n], sink [H].

    Returns (o [B, S, H, 512] fp32 (q.dtype if lowprec), lse fp32 [B, S, H], natural log, sink excluded).
    """
    attend = sparse_attention_lowprec if lowprec else sparse_attention
    outs, lses = [], []
    for b in range(q.shape[0]):
        idx = indices if indices.dim() == 2 else indices[b]
        o, lse = attend(q[b], kv[b], idx, sink, scale)
        outs.append(o), lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def merge_segments(outs: list[torch.Tensor], lses: list[torch.Tensor], sink: torch.Tensor | None = None) -> torch.Tensor:
    """One softmax over the union of disjoint key segments from per-segment results (seed note D5).

    outs[i]: [..., H, dv] sink-free normalised outputs; lses[i]: [..., H]; sink: [H] or None.
    O = Σ_i e^{lse_i} O_i / (Σ_i e^{lse_i} + e^{sink}), evaluated with a shared max. fp32.
    """
    lse = torch.stack([x.float() for x in lses])
    if sink is not None:
        lse = torch.cat((lse, sink.float().expand_as(lse[:1])))
    m = lse.amax(0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m)
    num = sum(w[i].unsqueeze(-1) * outs[i].float() for i in range(len(outs)))
    return num / w.sum(0).unsqueeze(-1)


def apply_sink(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """FlashMLA's sink form (§7.2): O_sink = O · 1/(1 + exp(sink − lse)). out [..., H, dv], lse [..., H]."""
    return out.float() * torch.sigmoid(lse.float() - sink.float()).unsqueeze(-1)


# ---------------------------------------------------------------- §7.3–7.4 output path

def output_projection(o: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, wo_a: Weight, wo_b: Weight,
                      n_groups: int) -> torch.Tensor:
    """FP32 oracle of §7.3–§7.4. o: [..., H, 512] attention output; positions: the query positions,
    shaped o.shape[:-2]; wo_a: [G·r, (H/G)·512]; wo_b: [D, G·r]. Returns fp32 [..., D].

    Inverse RoPE at the query position, then group g (heads [g·H/G, (g+1)·H/G)) goes through its
    own wo_a block: U[g] = O[g] @ Wa[g].T, and out = wo_b(flatten(U)).
    """
    o = apply_rope(o, positions.unsqueeze(-1), freqs, inverse=True)
    grouped = o.flatten(-2).unflatten(-1, (n_groups, -1))
    wa = dequant(wo_a).unflatten(0, (n_groups, -1))  # [G, r, (H/G)·512]
    u = torch.einsum("...gd,grd->...gr", grouped, wa)
    return linear(u.flatten(-2), wo_b)


def output_projection_lowprec(o: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, wo_a: Weight,
                              wo_b: Weight, n_groups: int) -> torch.Tensor:
    """The reference in bf16: inverse RoPE → bf16, wo_a as bf16 (convert.py dequantises it) in a
    bf16 einsum, wo_b per §2.6. Returns bf16 [..., D]."""
    o = apply_rope_lowprec(o.bfloat16(), positions.unsqueeze(-1), freqs, inverse=True)
    grouped = o.flatten(-2).unflatten(-1, (n_groups, -1))
    wa = dequant(wo_a).bfloat16().unflatten(0, (n_groups, -1))
    u = torch.einsum("...gd,grd->...gr", grouped, wa)
    return linear_lowprec(u.flatten(-2), wo_b)


def attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, positions: torch.Tensor,
              freqs: torch.Tensor, wo_a: Weight, wo_b: Weight, n_groups: int) -> torch.Tensor:
    """FP32 oracle of §7 end to end: q [B, S, H, 512], kv [B, N, 512], indices [B|·, S, n], sink [H],
    positions [B, S] or [S] (query positions). Returns fp32 [B, S, D]."""
    o, _ = attention_core(q, kv, indices, sink)
    return output_projection(o, positions, freqs, wo_a, wo_b, n_groups)


def attention_lowprec(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor,
                      positions: torch.Tensor, freqs: torch.Tensor, wo_a: Weight, wo_b: Weight,
                      n_groups: int) -> torch.Tensor:
    """§7 in the kernel's dtype (bf16 operands, fp32 scores, bf16 P and output). Returns bf16 [B, S, D]."""
    o, _ = attention_core(q, kv, indices, sink, lowprec=True)
    return output_projection_lowprec(o, positions, freqs, wo_a, wo_b, n_groups)
