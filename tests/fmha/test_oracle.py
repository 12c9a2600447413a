"""The attention oracle against a per-row fp64 loop and against torch SDPA."""

import math

import pytest
import torch

from oracles.fmha import dsv4_indices, hca_compressed, sparse_attention, sparse_attention_lowprec, window_indices


def _naive(q, kv, idx, sink, scale):
    s_q, h, d = q.shape
    out = torch.zeros(s_q, h, d, dtype=torch.float64)
    lse = torch.full((s_q, h), -math.inf, dtype=torch.float64)
    for t in range(s_q):
        keys = [int(j) for j in idx[t] if 0 <= int(j) < kv.shape[0]]
        if not keys:
            continue
        k = kv.double()[keys]
        l = (q[t].double() @ k.T) * scale  # [h, n]
        m = l.max(-1, keepdim=True).values
        p = torch.exp(l - m)
        den = p.sum(-1, keepdim=True)
        lse[t] = (torch.log(den) + m)[:, 0]
        if sink is not None:
            den = den + torch.exp(sink.double()[:, None] - m)
        out[t] = (p @ k) / den
    return out, lse


@pytest.mark.parametrize("s_q,s_kv,h,d,n,with_sink", [(5, 37, 3, 64, 11, True), (9, 20, 4, 32, 7, False)])
def test_sparse_attention_matches_fp64_loop(s_q, s_kv, h, d, n, with_sink):
    g = torch.Generator().manual_seed(s_q * 100 + n)
    q = torch.randn(s_q, h, d, generator=g)
    kv = torch.randn(s_kv, d, generator=g)
    idx = torch.randint(-1, s_kv, (s_q, n), generator=g)
    idx[0] = -1  # a row with no key at all
    sink = torch.randn(h, generator=g) if with_sink else None
    out, lse = sparse_attention(q, kv, idx, sink, d**-0.5)
    ref_o, ref_l = _naive(q, kv, idx, sink, d**-0.5)
    torch.testing.assert_close(out.double(), ref_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_l, rtol=1e-5, atol=1e-5)
    assert out[0].abs().max() == 0 and torch.isinf(lse[0]).all()
    lo, llse = sparse_attention_lowprec(q.bfloat16(), kv.bfloat16(), idx, sink, d**-0.5)
    assert lo.dtype == torch.bfloat16 and (lo.float() - out).abs().max() < 0.05


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 5), (False, 4)])
def test_window_indices_match_sdpa(causal, window):
    g = torch.Generator().manual_seed(7)
    s_q, s_k, h, d = 6, 13, 2, 16
    q, k = torch.randn(s_q, h, d, generator=g), torch.randn(s_k, d, generator=g)
    idx = window_indices(s_q, s_k, window, causal)
    out, _ = sparse_attention(q, k, idx, None, d**-0.5)
    off = s_k - s_q
    t, j = torch.arange(s_q)[:, None], torch.arange(s_k)[None, :]
    mask = torch.ones(s_q, s_k, dtype=torch.bool)
    if causal:
        mask &= j <= t + off
    if window is not None:
        mask &= j >= t + off - (window - 1)
        if not causal:
            mask &= j <= t + off + window - 1
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k[None].expand(h, -1, -1), k[None].expand(h, -1, -1), attn_mask=mask
    ).transpose(0, 1)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_dsv4_index_sets():
    s_q = 300
    idx = dsv4_indices(s_q, 128, hca_compressed(s_q, 128), s_q // 128)
    t = 260  # sees compressed 0, 1 (floor(261/128)=2) and raw 133..260
    row = sorted(int(j) for j in idx[t] if j >= 0)
    assert row == list(range(133, 261)) + [s_q + 0, s_q + 1]
    assert sorted(int(j) for j in idx[3] if j >= 0) == [0, 1, 2, 3]


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 7), (False, 3)])
def test_dense_equals_sparse_over_window_indices(causal, window):
    from oracles.fmha import dense_attention

    g = torch.Generator().manual_seed(11)
    s_q, s_k, h, d = 9, 21, 3, 32
    q, k, v = torch.randn(s_q, h, d, generator=g), torch.randn(s_k, d, generator=g), torch.randn(s_k, 48, generator=g)
    sink = torch.randn(h, generator=g)
    ref = sparse_attention(q, k, window_indices(s_q, s_k, window, causal), sink, 0.3, v)
    got = dense_attention(q, k, v, sink, 0.3, causal, window)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
