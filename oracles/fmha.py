"""Attention oracles (DSV4_SPEC.md §7.2) and the key-index builders that express every mask.

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


def sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    scale: float,
    v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 gathered-key attention with an optional per-head sink.

    q: [s_q, h, d]; kv: [s_kv, d] (the keys, and the values when v is None: MQA latent);
    v: [s_kv, dv] or None; indices: [s_q, n] int, -1 (or any out-of-range value) = invalid;
    sink: [h] fp32 or None; scale: softmax scale.
    Returns (out fp32 [s_q, h, dv], lse fp32 [s_q, h]), computed in chunks of query rows.
    """
    s_q, h, _ = q.shape
    vals = kv if v is None else v
    s_kv, dv = vals.shape
    n = indices.shape[1]
    out = torch.empty(s_q, h, dv, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    k32, v32 = kv.float(), vals.float()
    rows = max(1, _CHUNK_ELEMS // max(1, h * n * max(dv, q.shape[2]) // 64))
    for t0 in range(0, s_q, rows):
        t1 = min(s_q, t0 + rows)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < s_kv)
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        kg = k32[safe]  # [r, n, d]
        vg = v32[safe]  # [r, n, dv]
        logits = torch.einsum("rhd,rnd->rhn", q[t0:t1].float(), kg) * scale
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        m = logits.amax(-1, keepdim=True)  # [r, h, 1]
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(logits - m_safe)
        denom = p.sum(-1, keepdim=True)
        lse[t0:t1] = (torch.log(denom) + m_safe)[..., 0]
        if sink is not None:
            denom = denom + torch.exp(sink.float()[None, :, None] - m_safe)
        o = torch.einsum("rhn,rnd->rhd", p, vg)
        out[t0:t1] = torch.where(denom > 0, o / denom.clamp_min(1e-30), torch.zeros_like(o))
    return out, lse


def sparse_attention_lowprec(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    scale: float,
    v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same math in the kernel's dtype: bf16 operands, fp32 scores, P rounded to the input
    dtype before the PV product, output rounded to the input dtype; lse stays fp32."""
    s_q, h, _ = q.shape
    vals = kv if v is None else v
    s_kv, dv = vals.shape
    n = indices.shape[1]
    out = torch.empty(s_q, h, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    rows = max(1, _CHUNK_ELEMS // max(1, h * n * max(dv, q.shape[2]) // 64))
    for t0 in range(0, s_q, rows):
        t1 = min(s_q, t0 + rows)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < s_kv)
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        kg, vg = kv[safe], vals[safe]
        logits = torch.matmul(q[t0:t1], kg.transpose(1, 2)).float() * scale  # [r, h, n]
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        m = logits.amax(-1, keepdim=True)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(logits - m_safe)
        denom = p.sum(-1, keepdim=True)
        lse[t0:t1] = (torch.log(denom) + m_safe)[..., 0]
        if sink is not None:
            denom = denom + torch.exp(sink.float()[None, :, None] - m_safe)
        o = torch.matmul(p.to(q.dtype), vg).float()
        out[t0:t1] = torch.where(denom > 0, o / denom.clamp_min(1e-30), torch.zeros_like(o)).to(q.dtype)
    return out, lse


def window_indices(s_q: int, s_k: int, window: int | None, causal: bool, device=None) -> torch.Tensor:
    """Key lists for dense masked attention, query t aligned to key t + (s_k - s_q) (bottom-right).

    causal: keys j <= t + off; window w: keys j >= t + off - (w - 1) (w keys incl. the diagonal;
    w=None means unbounded). Non-causal without a window = all keys. Invalid slots are -1.
    Returns int32 [s_q, n] with n the widest row.
    """
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
    n = max(1, int(ok.sum(1).max()))
    # stable sort puts the valid keys first, in increasing order
    order = torch.argsort((~ok).to(torch.int8), dim=1, stable=True)[:, :n]
    idx = torch.gather(j.expand(s_q, s_k), 1, order)
    valid = torch.gather(ok, 1, order)
    return torch.where(valid, idx, torch.full_like(idx, -1)).to(torch.int32)


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
