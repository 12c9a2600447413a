"""`--compare` and `--bisect` on CPU, against backends a test registers with one op perturbed."""

import pytest
import torch

from dsv4bench.model.bisect import bisect
from dsv4bench.model.config import TINY
from dsv4bench.model.diff import compare
from dsv4bench.model.dispatch import OPS, OpTable, register_op
from dsv4bench.model.error import DiffError
from oracles.norm import rmsnorm_lowprec

STEPS = 8


def prompt():
    return torch.randint(2, TINY.vocab_size, (int(torch.randint(12, 40, ())),)).tolist()


def scaled(op: str, delta: float):
    """The oracle with its output multiplied by 1 ± delta (a random sign per element): relative L2
    error exactly delta."""
    def fn(*args, **kwargs):
        out = OPS[op].oracle(*args, **kwargs)
        return out * (1 + delta * (torch.randint(0, 2, out.shape) * 2 - 1))
    return fn


def shifted(op: str, level: float):
    """The oracle's output plus a fixed pattern (one per registration) of `level` times each row's
    std: the same inputs give the same output, so a run can be replayed."""
    pattern = torch.randn(TINY.vocab_size, generator=torch.Generator().manual_seed(int(torch.randint(1 << 30, ()))))

    def fn(*args, **kwargs):
        out = OPS[op].oracle(*args, **kwargs)
        return out + level * out.std(-1, keepdim=True) * pattern
    return fn


def bf16_rmsnorm(x, weight=None, eps=1e-6):
    """A good bf16 kernel: bf16 in, fp32 math, bf16 out."""
    return rmsnorm_lowprec(x.bfloat16(), weight, eps).float()


def noisy(op: str, level: float):
    """The oracle's output plus Gaussian noise of `level` times its RMS."""
    def fn(*args, **kwargs):
        out = OPS[op].oracle(*args, **kwargs)
        return out + level * out.square().mean().sqrt() * torch.randn_like(out)
    return fn


def test_compare_attributes_the_error_to_the_perturbed_op(tiny_engine):
    delta = float(torch.empty(()).uniform_(1e-3, 1e-2))
    register_op("output_projection", "test-perturbed", scaled("output_projection", delta))
    p = prompt()
    report = compare(tiny_engine, {"output_projection": "test-perturbed"}, p, STEPS)
    rows = {(r.scope, r.op): r for r in report.ops}
    # upstream of the first perturbed call nothing moves; the perturbed op is off by exactly delta
    assert rows[("embed", "embed")].error.rel == 0
    for op in ("hc_pre", "rmsnorm", "q_projection", "kv_projection", "sparse_attention"):
        row = rows[("layer 0 attn", op)]
        assert row.error.rel == 0 and row.backend == "oracle" and row.local is None, op
    first = rows[("layer 0 attn", "output_projection")]
    assert first.backend == "test-perturbed" and first.error.rel == pytest.approx(delta, rel=1e-3)
    # downstream the drift builds up, while the perturbed op's own error stays delta
    assert rows[("layer 0 ffn", "moe")].error.rel > 0 and rows[("layer 1 attn", "q_projection")].error.rel > 0
    for scope in ("layer 1 attn", "layer 3 attn", "mtp.0 attn"):
        assert rows[(scope, "output_projection")].local.rel == pytest.approx(delta, rel=1e-3), scope
    assert rows[("layer 0 attn", "hc_pre")].calls == STEPS and rows[("layer 0 ffn", "router")].error.mismatch is not None
    resid = {scope: (attn, layer) for scope, attn, layer in report.residual}
    assert list(resid) == ["layer 0", "layer 1", "layer 2", "layer 3", "mtp.0"]
    # the stream after layer 0's attention mixes the off-by-delta output in: less than delta off;
    # later the drift grows (and can flip a top-k set or an expert pick: no bound there)
    assert 0 < resid["layer 0"][0] < delta and all(attn > 0 and layer > 0 for attn, layer in resid.values())
    assert report.positions == len(p) + STEPS - 1
    assert report.logits_rel > 0 and 0.5 <= report.top1 <= 1


def test_the_bound_is_the_low_precision_model_on_the_same_tokens(tiny_engine):
    """`compare(bound=...)` diffs the low-precision model against the same oracle run: a candidate that
    is that model is within it at every layer, one with a noisy MoE at none."""
    from dsv4bench.model.lowprec_ops import LOWPREC, register_lowprec_ops

    register_lowprec_ops()
    low = OpTable().select_all(LOWPREC)
    bound = (dict(low.active), low.stream_dtype)
    p = prompt()
    same = compare(tiny_engine, dict(low.active), p, STEPS, low.stream_dtype, bound=bound)
    assert same.residual == same.bound.residual and all(same.within_bound())
    assert 0 < same.bound.logits_rel < 0.1 and same.top1 == same.bound.top1
    register_op("moe", "test-bound-noisy", noisy("moe", 0.3))
    worse = compare(tiny_engine, {**low.active, "moe": "test-bound-noisy"}, p, STEPS, low.stream_dtype, bound=bound)
    assert not any(worse.within_bound()) and worse.bound.residual == same.bound.residual
    with pytest.raises(DiffError, match="no bound"):
        compare(tiny_engine, {}, p, STEPS).within_bound()


def test_compare_finds_where_greedy_generation_diverges(tiny_engine):
    """lm_head with heavy noise: the residual streams are untouched (exactly 0), the logits are
    not, and the reported divergence is where the candidate's own greedy generation leaves the
    oracle's, with the oracle's margin between the two tokens there."""
    register_op("lm_head", "test-perturbed", shifted("lm_head", 2.0))
    p = prompt()
    report = compare(tiny_engine, {"lm_head": "test-perturbed"}, p, STEPS)
    assert report.positions == len(p) + STEPS - 1
    assert all(attn == 0 and layer == 0 for _, attn, layer in report.residual)
    assert report.logits_rel > 0.1 and report.top1 < 1
    d = report.divergence
    assert d is not None

    tiny_engine.ops = OpTable()
    oracle, logits = zip(*((t, out.logits) for t, out in tiny_engine.generate(p, STEPS, 0.0, stop_at_eos=False)))
    steps = {}
    tiny_engine.ops = OpTable({"lm_head": "test-perturbed"})
    for i, (t, _) in enumerate(tiny_engine.generate(p, d.step + 1, 0.0, stop_at_eos=False)):
        steps[i] = t
    first = next(i for i in range(STEPS) if steps.get(i, oracle[i]) != oracle[i])
    assert first == d.step and (d.oracle_token, d.candidate_token) == (oracle[first], steps[first])
    row = logits[first]
    assert d.margin > 0 and d.margin == pytest.approx((row[d.oracle_token] - row[d.candidate_token]).item(), rel=1e-4)
    assert d.spread == pytest.approx(row.std().item(), rel=1e-4)


def test_bisect_names_the_noisy_op(tiny_engine):
    """A backend with a bf16 rmsnorm (a good kernel), an exact hc_post copy and a noisy
    MoE: bisect names the MoE; with a second noisy op earlier in the dataflow, that one."""
    level = float(torch.empty(()).uniform_(0.02, 0.1))
    register_op("rmsnorm", "test-bisect", bf16_rmsnorm)
    register_op("hc_post", "test-bisect", OPS["hc_post"].oracle)
    register_op("moe", "test-bisect", noisy("moe", level))
    p = prompt()
    verdicts, named = bisect(tiny_engine, "test-bisect", p, STEPS)
    by_op = {v.op: v for v in verdicts}
    assert list(by_op) == ["rmsnorm", "hc_post", "moe"] and named == "moe"
    assert by_op["hc_post"].error == 0 and by_op["hc_post"].model == 0 and not by_op["hc_post"].jumps
    assert 0 < by_op["rmsnorm"].error < 3 * by_op["rmsnorm"].floor and not by_op["rmsnorm"].jumps
    assert by_op["rmsnorm"].floor == pytest.approx(2**-9, rel=0.5)  # one bf16 rounding
    assert by_op["moe"].error == pytest.approx(level, rel=0.2) and by_op["moe"].model > 0

    register_op("kv_projection", "test-bisect", noisy("kv_projection", level))
    assert bisect(tiny_engine, "test-bisect", p, STEPS)[1] == "kv_projection"


def test_bisect_names_nothing_when_every_op_is_within_its_floor(tiny_engine):
    register_op("rmsnorm", "test-bisect-fine", bf16_rmsnorm)
    register_op("sample", "test-bisect-fine", OPS["sample"].oracle)
    verdicts, named = bisect(tiny_engine, "test-bisect-fine", prompt(), STEPS)
    assert named is None and [v.op for v in verdicts] == ["rmsnorm", "sample"]


def test_bisect_catches_a_sampler_that_picks_wrong(tiny_engine):
    """The sampler's error is its picks that differ from the same logits."""
    register_op("sample", "test-bad-sampler", lambda logits, t, gen=None: logits.argmin(-1))
    verdicts, named = bisect(tiny_engine, "test-bad-sampler", prompt(), STEPS)
    assert named == "sample" and verdicts[0].error == 1.0
