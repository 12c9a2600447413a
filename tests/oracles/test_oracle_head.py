import torch
from hypothesis import given, settings, strategies as st

from oracles.head import lm_logits, lm_logits_lowprec, mtp_input, mtp_input_lowprec, sample
from oracles.linear import QuantWeight, dequant
from oracles.mhc import hc_head
from oracles.quant import quant_fp8_weight

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**31 - 1)
D, V = 128, 40


def _hc(g):
    return torch.randn(4, 4 * D, generator=g) * 0.05, torch.rand(1, generator=g) + 0.5, torch.randn(4, generator=g)


@SETTINGS
@given(seed=seeds)
def test_logits_are_normed_hc_head_times_the_head(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, D, generator=g).bfloat16()
    fn, scale, base = _hc(g)
    norm_w, head_w = 1 + 0.1 * torch.randn(D, generator=g), torch.randn(V, D, generator=g).bfloat16()
    logits = lm_logits(x, fn, scale, base, norm_w, head_w)
    y = hc_head(x, fn, scale, base).double()
    normed = y / y.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm_w.double()
    torch.testing.assert_close(logits.double(), normed @ head_w.double().T, rtol=1e-4, atol=1e-4)
    low = lm_logits_lowprec(x, fn, scale, base, norm_w, head_w)
    assert low.dtype == torch.float32
    assert 0 < (low - logits).norm() / logits.norm() < 2e-2


@SETTINGS
@given(seed=seeds)
def test_mtp_input_adds_the_projected_embedding_to_every_projected_stream(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, D, generator=g).bfloat16()
    ids = torch.randint(0, V, (2, 3), generator=g)
    embed = torch.randn(V, D, generator=g).bfloat16()
    enorm, hnorm = 1 + 0.1 * torch.randn(D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    e_proj, h_proj = (QuantWeight(*quant_fp8_weight(torch.randn(D, D, generator=g) * 0.1)) for _ in range(2))
    out = mtp_input(x, ids, embed, enorm, hnorm, e_proj, h_proj)
    assert out.shape == (2, 3, 4, D)

    def norm(v, w):
        v = v.double()
        return v / v.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w.double()

    e_part = norm(embed[ids], enorm) @ dequant(e_proj).double().T
    for s in range(4):
        expected = e_part + norm(x[:, :, s], hnorm) @ dequant(h_proj).double().T
        torch.testing.assert_close(out[:, :, s].double(), expected, rtol=1e-4, atol=1e-4)
    low = mtp_input_lowprec(x, ids, embed, enorm, hnorm, e_proj, h_proj)
    assert low.dtype == torch.bfloat16 and (low.double() - out.double()).norm() / out.double().norm() < 0.05


@SETTINGS
@given(seed=seeds)
def test_zero_temperature_is_argmax_and_sampling_is_seedable(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, V, generator=g)
    assert torch.equal(sample(logits, 0.0), logits.argmax(-1))
    a = sample(logits, 0.6, torch.Generator().manual_seed(seed))
    b = sample(logits, 0.6, torch.Generator().manual_seed(seed))
    assert torch.equal(a, b)
    # tiny temperatures collapse onto the argmax
    assert torch.equal(sample(logits, 1e-7, torch.Generator().manual_seed(seed)), logits.argmax(-1))


def test_gumbel_max_samples_from_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 40_000
    draws = sample(logits.expand(n, 4), 0.7, torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=4).double() / n
    expected = torch.softmax(logits.double() / 0.7, dim=-1)
    # 5 standard errors of a binomial proportion
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / n).sqrt())
