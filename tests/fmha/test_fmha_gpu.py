"""Our SM90 kernel against the FP32 oracle on a GPU (docs/benchmarking.md rule), every production case
plus hypothesis draws: hd 64-512, sink on/off, causal/window masks, invalid indices, partial
tiles, non-square, ragged and decode shapes. Skipped without CUDA."""

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, get_impl
from dsv4bench.core.evaluate import case_generator, poison
from kernels.fmha import variants
from kernels.fmha.family import FAMILY
from kernels.fmha.glue import FmhaCuteDSL, config_for
from sweeps.fmha import _sparse

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# FP8-cache decode cases run three launches of their own: tests/fmha/test_decode_fp8_gpu.py
CASES = [c for c in FAMILY.cases(SweepOptions(examples=16, seed=1)) if c.get("op", "attention") == "attention"]
IMPL = FmhaCuteDSL()
_compiled: dict = {}


def _run(case, impl=IMPL):
    cfg = config_for(case)
    key = (impl.kernel_class, cfg)  # a variant compiles its own subclass
    if key not in _compiled:
        _compiled[key] = impl.compile(case, "sm_90a")
    x = FAMILY.make_inputs(case, case_generator(case), "cuda")
    out = FAMILY.alloc_outputs(case, "cuda")
    poison(out)
    res = impl.run(case, x, out, _compiled[key])
    torch.cuda.synchronize()
    return x, res


def _many_items(case) -> bool:
    """A persistent-kernel case with more work items than the 3 CTAs of `test_persistent_ctas_walk_many_items`."""
    cfg = config_for(case)
    blocks = -(-case["s_q"] // cfg.tq) if case["mask"] != "sparse" else case["s_q"]
    return cfg.persistent and blocks * case["h_kv"] * cfg.n_hblk * case["b"] > 3


# v10 and its forms with one of v11's changes (the A/B forms of the default, kernels/fmha/prefill_v11.py)
# differ on the key split's per-token path: every such case (prefill, decode shapes, ragged / invalid
# lists, hpg 1..128), plus one case of each other schedule where they compile v10's code
V11_IMPLS = [cls.name for cls in variants.PREFILL_VARIANTS]
V11_CASES = [c for c in CASES if config_for(c).key_split and config_for(c).per_token_idx] + list(
    {(config_for(c).key_split, config_for(c).n_dsplit, config_for(c).tma_kv): c for c in CASES
     if not (config_for(c).key_split and config_for(c).per_token_idx)}.values())

PERSISTENT_CASES = list({(c["hd"], c["mask"]): c for c in reversed(CASES) if _many_items(c)}.values())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cutedsl_matches_fp32_oracle(case):
    _check(case, IMPL)


@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=[c.id for c in PERSISTENT_CASES])
def test_persistent_ctas_walk_many_items(case):
    """3 CTAs for the whole grid: each runs items of both snake directions, of different list
    lengths (causal), with the pipeline's stages and phases carried across items."""
    _check(case, FmhaCuteDSL(persistent_ctas=3))


# the TP splits' head counts (hpg < 64: v12's O boxes of hpg rows, or v10's code at 20 / 24), ragged lists with invalid
# slots, 1-3 kv groups (the Q box reads the next group's rows, the O box must not write them)
TP_CASES = [Case("fmha", {**_sparse(h_q=hpg * h_kv, s_q=97, topk=640, invalid=0.25), "h_kv": h_kv}, 0, "tp-split")
            for hpg, h_kv in ((16, 1), (8, 1), (1, 1), (3, 1), (12, 1), (32, 1), (48, 1), (20, 1), (24, 1), (16, 2),
                              (8, 3))]


@pytest.mark.parametrize("case", TP_CASES, ids=[f"h_q{c['h_q']}-h_kv{c['h_kv']}" for c in TP_CASES])
def test_tp_split_heads_match_fp32_oracle(case):
    _check(case, IMPL)


@pytest.mark.parametrize("impl_name", V11_IMPLS)
@pytest.mark.parametrize("case", V11_CASES, ids=[c.id for c in V11_CASES])
def test_prefill_forms_match_fp32_oracle(case, impl_name):
    _check(case, get_impl("fmha", impl_name))


def _check(case, impl):
    print(case)
    x, res = _run(case, impl)
    ok, metrics = compare_outputs(res, FAMILY.oracle(case, x), FAMILY.lowprec(case, x),
                                  lambda n: FAMILY.tolerance_for(case, n))
    summary = "; ".join(f"{k}: {m.summary()}" for k, m in metrics.items())
    print(summary)
    assert ok, f"{case}: {summary}"


def test_poisoned_output_fails_the_rule():
    """The comparison catches an unwritten output (guards against a test that cannot fail)."""
    case = next(c for c in CASES if c["mask"] == "sparse" and c["s_q"] < 1000)
    x = FAMILY.make_inputs(case, case_generator(case), "cuda")
    bad = FAMILY.alloc_outputs(case, "cuda")
    poison(bad)
    ok, _ = compare_outputs(bad, FAMILY.oracle(case, x), FAMILY.lowprec(case, x), lambda n: FAMILY.tolerance)
    assert not ok
