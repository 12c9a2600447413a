import torch
from hypothesis import given, settings, strategies as st

from oracles.hadamard import hadamard_rotate
from oracles.indexer import (head_weight_scale, indexer_queries, indexer_queries_lowprec, indexer_scores,
                             indexer_scores_lowprec, indexer_topk, indexer_weights,
                             indexer_weights_lowprec)
from oracles.linear import QuantWeight, linear
from oracles.quant import fp4_qdq, quant_fp8_weight
from oracles.rope import COMPRESSED_ROPE, apply_rope, rope_freqs

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def test_head_weight_scale_of_the_real_indexer():
    assert abs(head_weight_scale(64, 128) - 0.011048543456039806) < 1e-15


def _qkw(g, b, s, h, n, hd=128):
    return (torch.randn(b, s, h, hd, generator=g), torch.randn(b, n, hd, generator=g),
            torch.randn(b, s, h, generator=g) * 0.1)


@SETTINGS
@given(seed=seeds, s=st.integers(1, 20))
def test_scores_are_weighted_relu_dot_products_masked_causally(seed, s):
    g = torch.Generator().manual_seed(seed)
    n = s // 4
    q, k, w = _qkw(g, 2, s, 3, max(n, 1))
    k = k[:, :n]
    pos = torch.arange(s)
    scores = indexer_scores(q, k, w, pos)
    assert scores.shape == (2, s, n)
    for t in range(s):
        for e in range(n):
            if e < (t + 1) // 4:
                expected = sum(w[:, t, h].double() * (q[:, t, h].double() * k[:, e].double()).sum(-1).clamp(min=0)
                               for h in range(3))
                torch.testing.assert_close(scores[:, t, e].double(), expected, rtol=1e-5, atol=1e-5)
            else:
                assert torch.isneginf(scores[:, t, e]).all()


@SETTINGS
@given(seed=seeds, s=st.integers(4, 64), topk=st.integers(1, 12))
def test_topk_never_selects_an_invisible_entry_and_picks_the_best_visible_set(seed, s, topk):
    g = torch.Generator().manual_seed(seed)
    n = s // 4
    q, k, w = _qkw(g, 1, s, 2, n)
    start = torch.randint(0, 50, (), generator=g).item() * 4  # a chunk at an offset: t = start + i
    k = torch.cat((torch.randn(1, start // 4, 128, generator=g), k), dim=1)
    pos = start + torch.arange(s)
    scores = indexer_scores(q, k, w, pos)
    sel = indexer_topk(scores, topk)
    assert sel.shape == (1, s, min(topk, k.shape[1]))
    for t in range(s):
        visible = (pos[t].item() + 1) // 4
        picked = sel[0, t][sel[0, t] >= 0]
        assert torch.all(picked < visible), "top-k must never select s >= floor((t+1)/m)"
        assert len(picked) == min(topk, visible) == len(set(picked.tolist()))
        best = scores[0, t, :visible].sort(descending=True).values
        if len(picked):
            kth = best[len(picked) - 1]
            assert torch.all(scores[0, t, picked] >= kth)


@SETTINGS
@given(seed=seeds)
def test_hadamard_rotation_leaves_unquantised_scores_unchanged(seed):
    g = torch.Generator().manual_seed(seed)
    q, k, w = _qkw(g, 1, 8, 4, 2)
    pos = torch.arange(8) + 8
    plain = indexer_scores(q.double(), k.double(), w.double(), pos)
    rotated = indexer_scores(hadamard_rotate(q, torch.float64), hadamard_rotate(k, torch.float64), w.double(), pos)
    torch.testing.assert_close(rotated, plain, rtol=1e-9, atol=1e-9)
    # with the FP4 simulation the rotated dot products are perturbed, but stay recognisable
    exact = torch.einsum("bshd,bnd->bshn", q.double(), k.double())
    quantised = torch.einsum("bshd,bnd->bshn", fp4_qdq(hadamard_rotate(q)).double(), fp4_qdq(hadamard_rotate(k)).double())
    rel = (quantised - exact).norm() / exact.norm()
    assert 1e-3 < rel < 0.4


@SETTINGS
@given(seed=seeds)
def test_queries_rope_the_last_64_dims_then_rotate_and_fp4_quantise(seed):
    g = torch.Generator().manual_seed(seed)
    qr = torch.randn(2, 3, 128, generator=g).bfloat16()
    wq_b = QuantWeight(*quant_fp8_weight(torch.randn(2 * 128, 128, generator=g) * 0.1))
    pos = torch.randint(0, 10_000, (2, 3), generator=g)
    freqs = rope_freqs(COMPRESSED_ROPE)
    plain = indexer_queries(qr, wq_b, 2, pos, freqs, qat=False)
    expected = apply_rope(linear(qr, wq_b).unflatten(-1, (2, 128)), pos.unsqueeze(-1), freqs)
    torch.testing.assert_close(hadamard_rotate(plain), expected, rtol=1e-5, atol=1e-5)
    q = indexer_queries(qr, wq_b, 2, pos, freqs)
    assert torch.equal(q, fp4_qdq(plain))
    low = indexer_queries_lowprec(qr, wq_b, 2, pos, freqs)
    assert low.dtype == torch.bfloat16 and (low.double() - q.double()).norm() / q.double().norm() < 0.2


@SETTINGS
@given(seed=seeds)
def test_weights_and_lowprec_scores(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 8, 32, generator=g).bfloat16()
    proj = torch.randn(4, 32, generator=g).bfloat16()
    w = indexer_weights(x, proj)
    torch.testing.assert_close(w, x.float() @ proj.float().T * (128**-0.5 * 4**-0.5))
    w_low = indexer_weights_lowprec(x, proj)
    assert w_low.dtype == torch.bfloat16 and torch.equal(w_low, torch.nn.functional.linear(x, proj) * (128**-0.5 * 4**-0.5))
    q, k, _ = _qkw(g, 1, 8, 4, 2)
    pos = torch.arange(8)
    ref = indexer_scores(q.bfloat16(), k.bfloat16(), w, pos)
    low = indexer_scores_lowprec(q.bfloat16(), k.bfloat16(), w.bfloat16(), pos)
    assert torch.equal(torch.isneginf(low), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    # each bf16 rounding (dot product, weight, product, final sum) costs ≤ 2^-8 of the terms' magnitude
    magnitude = torch.einsum("bshd,bnd->bshn", q.bfloat16().double(), k.bfloat16().double()).relu()
    magnitude = (magnitude * w.double().abs().unsqueeze(-1)).sum(2)
    assert torch.all((low - ref).abs()[finite] <= 5 * 2**-8 * magnitude[finite] + 1e-6)


def test_topk_ties_go_to_the_lower_index():
    from oracles.indexer import indexer_topk

    scores = torch.tensor([[0.0, 2.0, 0.0, 0.0, 2.0, float("-inf")]])
    assert indexer_topk(scores, 3).tolist() == [[1, 4, 0]]
    assert indexer_topk(scores, 6).tolist() == [[1, 4, 0, 2, 3, -1]]
