"""Attention oracles (docs/model-math.md §7.2) and the key-index builders that express every mask.

One formulation covers dense, causal, sliding-window, CSA top-k and HCA attention: each query
row t gets a list of key rows `indices[t, :]` into one kv tensor, -1 = invalid (skipped). The
per-head sink is a virtual key with logit `sink[h]` and a zero value: it only enlarges the
denominator.

    l_j   = (q[t,h] . k[j]) * scale
    o[t,h] = sum_j exp(l_j - M) v[j] / (sum_j exp(l_j - M) + exp(sink[h] - M))
    lse[t,h] = log(sum_j exp(l_j - M)) + M          (natural log; the sink is not in the lse)

A row with no valid key has o = 0 and lse = -inf.
"""

from __future__ import annotations

import torch

# Scores per chunk of query rows; caps the [rows, h, n] fp32 score block the oracle materialises.
_CHUNK_ELEMS = 1 << 26


def _gemm_lowprec(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as a bf16 GEMM computes it (fp32 accumulation of bf16 products, result rounded to
    the input dtype), returned in fp32. Written with fp32 matmuls so it is fast on a CPU too."""
    return torch.matmul(a.float(), b.float()).to(a.dtype).float()


def _attend(q, k, v, valid, sink, scale, lowprec):
    """Softmax attention of q [r, h, d] over per-row key sets k [r|1, n, d], v [r|1, n, dv]
    with valid [r, n]. fp32 (oracle) or the kernel's dtype (lowprec: GEMM outputs rounded to the
    input dtype, P rounded to it before PV, output rounded)."""
    if lowprec:  # a bf16 GEMM: bf16 operands, fp32 accumulation, output rounded to bf16
        logits = _gemm_lowprec(q, k.transpose(-1, -2)) * scale  # [r, h, n]
    else:
        logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    m = logits.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(logits - m_safe)
    denom = p.sum(-1, keepdim=True)
    lse = (torch.log(denom) + m_safe)[..., 0]
    if sink is not None:
        denom = denom + torch.exp(sink.float()[None, :, None] - m_safe)
    o = _gemm_lowprec(p.to(q.dtype), v) if lowprec else torch.matmul(p, v.float())
    o = torch.where(denom > 0, o / denom.clamp_min(1e-30), torch.zeros_like(o))
    return (o.to(q.dtype) if lowprec else o), lse


def _rows_per_chunk(n: int, h: int, d: int, dv: int, gathered: bool) -> int:
    per_row = h * n + (n * (d + dv) if gathered else 0)
    return max(1, _CHUNK_ELEMS // max(1, per_row))


def sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    scale: float,
    v: torch.Tensor | None = None,
    lowprec: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gathered-key attention with an optional per-head sink (FP32 unless lowprec).

    q: [s_q, h, d]; kv: [s_kv, d] (the keys, and the values when v is None: MQA latent);
    v: [s_kv, dv] or None; indices: [s_q, n] int, -1 (or any out-of-range value) = invalid;
    sink: [h] fp32 or None; scale: softmax scale.
    Returns (out [s_q, h, dv] fp32 (q.dtype if lowprec), lse fp32 [s_q, h]), in chunks of rows.
    lowprec: the same math in the kernel's dtype (the low-precision reference).
    """
    s_q, h, d = q.shape
    vals = kv if v is None else v
    s_kv, dv = vals.shape
    n = indices.shape[1]
    out = torch.empty(s_q, h, dv, dtype=q.dtype if lowprec else torch.float32, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    rows = _rows_per_chunk(n, h, d, dv, gathered=True)
    for t0 in range(0, s_q, rows):
        t1 = min(s_q, t0 + rows)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < s_kv)
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        out[t0:t1], lse[t0:t1] = _attend(q[t0:t1], kv[safe], vals[safe], valid, sink, scale, lowprec)
    return out, lse


def sparse_attention_lowprec(q, kv, indices, sink, scale, v=None):
    """`sparse_attention` in the kernel's dtype (see there)."""
    return sparse_attention(q, kv, indices, sink, scale, v, lowprec=True)


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None,
    scale: float,
    causal: bool,
    window: int | None,
    lowprec: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of q [s_q, h, d] over k [s_kv, d], v [s_kv, dv] under the mask of
    `window_mask` (bottom-right aligned). Same outputs and dtypes as `sparse_attention`."""
    s_q, h, d = q.shape
    s_kv, dv = v.shape
    out = torch.empty(s_q, h, dv, dtype=q.dtype if lowprec else torch.float32, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    rows = _rows_per_chunk(s_kv, h, d, dv, gathered=False)
    for t0 in range(0, s_q, rows):
        t1 = min(s_q, t0 + rows)
        valid = window_mask(s_q, s_kv, window, causal, q.device)[t0:t1]
        out[t0:t1], lse[t0:t1] = _attend(q[t0:t1], k[None], v[None], valid, sink, scale, lowprec)
    return out, lse


def window_mask(s_q: int, s_k: int, window: int | None, causal: bool, device=None) -> torch.Tensor:
    """bool [s_q, s_k]: query t is aligned to key t + (s_k - s_q) (bottom-right).

    causal: keys j <= t + off; window w: keys j >= t + off - (w - 1) (w keys incl. the diagonal),
    and without causal also j <= t + off + (w - 1). window None = unbounded."""
    off = s_k - s_q
    t = torch.arange(s_q, device=device)[:, None]
    j = torch.arange(s_k, device=device)[None, :]
    ok = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if causal:
        ok &= j <= t + off
    if window is not None:
        ok &= j >= t + off - (window - 1)
        if not causal:
            ok &= j <= t + off + (window - 1)
    return ok


def window_indices(s_q: int, s_k: int, window: int | None, causal: bool, device=None) -> torch.Tensor:
    """The `window_mask` key sets as index lists: int32 [s_q, n], n the widest row, ascending,
    -1 padded."""
    ok = window_mask(s_q, s_k, window, causal, device)
    n = max(1, int(ok.sum(1).max()))
    j = torch.arange(s_k, device=device)[None, :].expand(s_q, s_k)
    order = torch.argsort((~ok).to(torch.int8), dim=1, stable=True)[:, :n]  # valid keys first
    idx = torch.gather(j, 1, order)
    return torch.where(torch.gather(ok, 1, order), idx, torch.full_like(idx, -1)).to(torch.int32)


def dsv4_indices(
    s_q: int, window: int, compressed: torch.Tensor | None, n_comp_total: int, device=None
) -> torch.Tensor:
    """The §7.1 key set in prefill encoding: kv_all = cat(raw[0:s_q], compressed[...]).

    Row t = window keys max(0, t-window+1)..t (as -1 padded to `window` slots) followed by
    `compressed[t, :]` shifted by s_q (entries < 0 stay -1). compressed may be None (SWA-only).
    n_comp_total only documents the size of the compressed part (entries must be < it).
    """
    t = torch.arange(s_q, device=device)[:, None]
    w = t - (window - 1) + torch.arange(window, device=device)[None, :]
    win = torch.where(w >= 0, w, torch.full_like(w, -1))
    if compressed is None:
        return win.to(torch.int32)
    c = compressed.to(win.dtype)
    if (c >= n_comp_total).any():
        raise ValueError("compressed index out of range")
    comp = torch.where(c >= 0, c + s_q, torch.full_like(c, -1))
    return torch.cat([comp, win], dim=1).to(torch.int32)


def hca_compressed(s_q: int, ratio: int, device=None) -> torch.Tensor:
    """HCA: query t sees every compressed entry s < floor((t+1)/ratio); -1 pads the rest."""
    n = s_q // ratio
    t = torch.arange(s_q, device=device)[:, None]
    s = torch.arange(max(n, 1), device=device)[None, :]
    return torch.where(s < (t + 1) // ratio, s, torch.full_like(s, -1))[:, :n] if n else s[:, :0].expand(s_q, 0)
