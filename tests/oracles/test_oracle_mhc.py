import math

import torch
from hypothesis import given, settings, strategies as st

from oracles.mhc import (embed_streams, hc_head, hc_head_lowprec, hc_mixes, hc_post, hc_post_lowprec, hc_pre,
                         hc_pre_lowprec, sinkhorn)

SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**31 - 1)
EPS = 1e-6


def _params(g, d, n_mix):
    fn = torch.randn(n_mix, 4 * d, generator=g) * 0.1
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(n_mix, generator=g)
    return fn, scale, base


def _sigmoid(v):
    return 1 / (1 + math.exp(-v))


def _sinkhorn_by_hand(c, iters):
    """Scalar fp64 loops, written from §3.3 independently of the oracle's tensor ops."""
    c = [[math.exp(v) for v in row] for row in c]
    c = [[v / sum(row) + EPS for v in row] for row in c]

    def col_norm(c):
        sums = [sum(c[j][k] for j in range(4)) + EPS for k in range(4)]
        return [[c[j][k] / sums[k] for k in range(4)] for j in range(4)]

    c = col_norm(c)
    for _ in range(iters - 1):
        c = [[v / (sum(row) + EPS) for v in row] for row in c]
        c = col_norm(c)
    return torch.tensor(c, dtype=torch.float64)


@SETTINGS
@given(seed=seeds, spread=st.floats(0.1, 8.0))
def test_sinkhorn_columns_sum_to_one_and_match_the_scalar_recurrence(seed, spread):
    logits = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(seed)) * spread
    c = sinkhorn(logits)
    assert torch.all(c > 0)
    torch.testing.assert_close(c.sum(-2), torch.ones(3, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(c[1].double(), _sinkhorn_by_hand(logits[1].double().tolist(), 20), rtol=1e-5, atol=1e-6)


@SETTINGS
@given(seed=seeds, d=st.sampled_from([8, 32]))
def test_hc_pre_matches_the_per_token_formula(seed, d):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, d, generator=g).bfloat16()
    fn, scale, base = _params(g, d, 24)
    y, post, comb = hc_pre(x, fn, scale, base)
    for t in range(2):
        xt = x[t].double()
        flat = xt.flatten()
        mixes = (fn.double() @ flat) / math.sqrt((flat * flat).mean().item() + EPS)
        pre = [_sigmoid(mixes[i].item() * scale[0].item() + base[i].item()) + EPS for i in range(4)]
        expected_post = [2 * _sigmoid(mixes[4 + i].item() * scale[1].item() + base[4 + i].item()) for i in range(4)]
        comb_logits = [[mixes[8 + 4 * j + k].item() * scale[2].item() + base[8 + 4 * j + k].item() for k in range(4)]
                       for j in range(4)]
        torch.testing.assert_close(y[t].double(), sum(pre[i] * xt[i] for i in range(4)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(post[t].double(), torch.tensor(expected_post, dtype=torch.float64), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(comb[t].double(), _sinkhorn_by_hand(comb_logits, 20), rtol=1e-4, atol=1e-6)
    y_low, post_low, comb_low = hc_pre_lowprec(x, fn, scale, base)
    assert y_low.dtype == torch.bfloat16 and torch.equal(y_low, y.bfloat16())
    assert torch.equal(post_low, post) and torch.equal(comb_low, comb)


@SETTINGS
@given(seed=seeds, c=st.floats(0.5, 20.0))
def test_hc_pre_weights_are_invariant_to_the_stream_scale(seed, c):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 16, generator=g)
    fn, scale, base = _params(g, 16, 24)
    y1, post1, comb1 = hc_pre(x, fn, scale, base)
    y2, post2, comb2 = hc_pre(x * c, fn, scale, base)
    torch.testing.assert_close(y2, y1 * c, rtol=1e-4, atol=1e-5 * c)  # y (and its fp32 rounding) scales with c
    torch.testing.assert_close(post2, post1, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(comb2, comb1, rtol=1e-4, atol=1e-6)
    assert torch.all((post1 > 0) & (post1 < 2))


@SETTINGS
@given(seed=seeds)
def test_hc_post_mixes_residual_columns_and_adds_the_scaled_output(seed):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(2, 8, generator=g).bfloat16()
    residual = torch.randn(2, 4, 8, generator=g).bfloat16()
    post = torch.rand(2, 4, generator=g) * 2
    comb = sinkhorn(torch.randn(2, 4, 4, generator=g))
    out = hc_post(o, residual, post, comb)
    for k in range(4):
        expected = post[:, k, None].double() * o.double() + sum(
            comb[:, j, k, None].double() * residual[:, j].double() for j in range(4))
        torch.testing.assert_close(out[:, k].double(), expected, rtol=1e-5, atol=1e-6)
    # identity mixing with no output returns the residual; lowprec is the bf16 cast
    same = hc_post(o, residual, torch.zeros(2, 4), torch.eye(4).expand(2, 4, 4))
    assert torch.equal(same, residual.float())
    assert torch.equal(hc_post_lowprec(o, residual, post, comb), out.bfloat16())


@SETTINGS
@given(seed=seeds)
def test_hc_head_is_a_sigmoid_weighted_stream_sum(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 16, generator=g).bfloat16()
    fn, scale, base = torch.randn(4, 64, generator=g) * 0.1, torch.rand(1, generator=g) + 0.5, torch.randn(4, generator=g)
    y = hc_head(x, fn, scale, base)
    mixes = hc_mixes(x, fn).double()
    pre = torch.sigmoid(mixes * scale.double() + base.double()) + EPS
    torch.testing.assert_close(y.double(), (pre.unsqueeze(-1) * x.double()).sum(-2), rtol=1e-5, atol=1e-5)
    flat = x[0].double().flatten()
    torch.testing.assert_close(mixes[0], fn.double() @ flat / flat.pow(2).mean().add(EPS).sqrt(), rtol=1e-5, atol=1e-6)
    assert torch.equal(hc_head_lowprec(x, fn, scale, base), y.bfloat16())


def test_embedding_fills_every_stream_with_the_token_row():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(50, 12, generator=g).bfloat16()
    ids = torch.randint(0, 50, (2, 5), generator=g)
    h = embed_streams(ids, table)
    assert h.shape == (2, 5, 4, 12) and h.dtype == torch.bfloat16
    for s in range(4):
        assert torch.equal(h[:, :, s], table[ids])
