import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from oracles.linear import QuantWeight, linear_lowprec
from oracles.moe import ExpertWeights, expert, expert_lowprec, moe, moe_lowprec, route, router_scores, swiglu
from oracles.quant import quant_fp4_weight, quant_fp8_weight

SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**31 - 1)
T, D, E, K, INTER = 7, 128, 16, 6, 128


def _x(g):
    return torch.randn(T, D, generator=g).bfloat16()


@SETTINGS
@given(seed=seeds, scale=st.sampled_from([1.5, 2.5]))
def test_router_weights_use_unbiased_sqrt_softplus_and_sum_to_route_scale(seed, scale):
    g = torch.Generator().manual_seed(seed)
    x, gate = _x(g), torch.randn(E, D, generator=g) * 0.1
    bias = torch.randn(E, generator=g)
    weights, idx = route(x, gate, K, scale, bias=bias)
    torch.testing.assert_close(weights.sum(-1), torch.full((T,), scale), rtol=1e-6, atol=1e-6)
    logits = x.double() @ gate.double().T
    s = torch.sqrt(torch.log1p(torch.exp(logits)))
    torch.testing.assert_close(router_scores(x, gate).double(), s, rtol=1e-5, atol=1e-6)
    for t in range(T):
        expected_ids = (s[t] + bias.double()).argsort(descending=True)[:K]
        assert set(idx[t].tolist()) == set(expected_ids.tolist()), "the bias decides the selection"
        chosen = s[t, idx[t]]
        torch.testing.assert_close(weights[t].double(), chosen / chosen.sum() * scale, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(seed=seeds)
def test_a_large_bias_forces_selection_without_changing_the_weights_formula(seed):
    g = torch.Generator().manual_seed(seed)
    x, gate = _x(g), torch.randn(E, D, generator=g) * 0.1
    favoured = torch.randint(0, E, (1,), generator=g).item()
    bias = torch.zeros(E)
    bias[favoured] = 100.0
    weights, idx = route(x, gate, K, 1.5, bias=bias)
    assert (idx == favoured).any(-1).all()
    s = router_scores(x, gate)
    slot = (idx == favoured).int().argmax(-1)
    expected = s[:, favoured] / s.gather(-1, idx).sum(-1) * 1.5  # unbiased score, renormalised
    torch.testing.assert_close(weights[torch.arange(T), slot], expected)


@SETTINGS
@given(seed=seeds)
def test_hash_routing_reads_the_token_table_and_ignores_any_bias(seed):
    g = torch.Generator().manual_seed(seed)
    x, gate = _x(g), torch.randn(E, D, generator=g) * 0.1
    table = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(50)])
    ids = torch.randint(0, 50, (T,), generator=g)
    weights, idx = route(x, gate, K, 2.5, bias=torch.randn(E, generator=g) * 100, tid2eid=table, input_ids=ids)
    assert torch.equal(idx, table[ids])
    s = router_scores(x, gate).gather(-1, table[ids])
    torch.testing.assert_close(weights, s / s.sum(-1, keepdim=True) * 2.5)


@SETTINGS
@given(gate=st.floats(-50, 50), up=st.floats(-50, 50))
def test_swiglu_clamps_gate_from_above_and_up_on_both_sides(gate, up):
    h = swiglu(torch.tensor([gate]), torch.tensor([up]))
    g_c, u_c = min(gate, 10.0), max(-10.0, min(up, 10.0))
    expected = g_c / (1 + torch.exp(torch.tensor(-g_c, dtype=torch.float64))) * u_c
    torch.testing.assert_close(h.double(), expected.reshape(1), rtol=1e-5, atol=1e-6)
    assert abs(h.item()) <= 10.0 * F.silu(torch.tensor(10.0)).item() * (1 + 1e-6)


def _expert_weights(g, fmt):
    mats = [torch.randn(INTER, D, generator=g) * 0.1, torch.randn(D, INTER, generator=g) * 0.1,
            torch.randn(INTER, D, generator=g) * 0.1]
    quant = {"fp8": quant_fp8_weight, "fp4": quant_fp4_weight}[fmt]
    return ExpertWeights(*(QuantWeight(*quant(m)) for m in mats))


@settings(max_examples=10, deadline=None)
@given(seed=seeds, fmt=st.sampled_from(["fp8", "fp4"]))
def test_routing_weight_is_applied_before_w2(seed, fmt):
    g = torch.Generator().manual_seed(seed)
    x, w = _x(g), _expert_weights(g, fmt)
    rw = torch.rand(T, 1, generator=g) + 0.1
    torch.testing.assert_close(expert(x, w, rw), rw * expert(x, w), rtol=1e-4, atol=1e-5)  # linear in fp32
    # the low-precision path rounds (weight · h) to bf16 and FP8-quantises it as the input of w2
    h = swiglu(linear_lowprec(x, w.w1).float(), linear_lowprec(x, w.w3).float())
    assert torch.equal(expert_lowprec(x, w, rw), linear_lowprec((rw * h).bfloat16(), w.w2))
    low = expert_lowprec(x, w, rw)
    ref = expert(x, w, rw)
    assert (low.double() - ref.double()).norm() / ref.double().norm() < 0.1


@settings(max_examples=8, deadline=None)
@given(seed=seeds)
def test_moe_combines_routed_experts_and_the_shared_expert(seed):
    g = torch.Generator().manual_seed(seed)
    x, gate = _x(g), torch.randn(E, D, generator=g) * 0.1
    experts = [ExpertWeights(*(torch.randn(*shape, generator=g).bfloat16() * 0.1
                               for shape in ((INTER, D), (D, INTER), (INTER, D)))) for _ in range(E)]
    shared = _expert_weights(g, "fp8")
    weights, idx = route(x, gate, K, 1.5, bias=torch.randn(E, generator=g))
    y = moe(x, weights, idx, experts, shared)
    for t in (0, T - 1):
        expected = expert(x[t:t + 1], shared)[0].double()
        for k in range(K):
            expected += weights[t, k].double() * expert(x[t:t + 1], experts[idx[t, k]])[0].double()
        torch.testing.assert_close(y[t].double(), expected, rtol=1e-4, atol=1e-5)
    low = moe_lowprec(x, weights, idx, experts, shared)
    assert low.dtype == torch.bfloat16 and (low.double() - y.double()).norm() / y.double().norm() < 0.1  # FP8 act quant
