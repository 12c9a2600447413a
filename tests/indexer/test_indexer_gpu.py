"""The SM90 indexer logits kernel against the oracle on the H100: ragged shapes (S_kv < 64, lengths off
the 128-key tile and the 2-token block, one query, chunks at an offset, packed sequences, arbitrary
and out-of-range ks / ke, all-equal keys), every configuration and variant, forced key splits and few
CTAs (ring phases across units), strided outputs and keys, and the DSV4 prefill shapes through the
harness's evaluation path.

Every check here asserts, beyond the harness's float rule (core/compare.py): no NaN anywhere (the
output is NaN-poisoned: an unwritten logit shows), and -inf exactly where the key is outside
[ks, ke) (which the float rule now also requires)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import Tolerance, get_family, get_impl
from kernels.indexer.config import SHIPPED, choose_config
from kernels.indexer.family import RELATIVE_MIN_LOGITS, case_ranges
from kernels.indexer.glue import (causal_ranges, compile_logits, lowprec_of, make_inputs, oracle_of, range_mask,
                                  run_logits, varlen_ranges)
from kernels.indexer.logits_sm90 import LogitsConfig
from sweeps import indexer as space

pytestmark = pytest.mark.gpu

FAMILY = get_family("indexer")
_COMPILED: dict = {}


def _compiled(cfg):
    if cfg not in _COMPILED:
        _COMPILED[cfg] = compile_logits(cfg)
    return _COMPILED[cfg]


def _check(out, x, what, ties=False):
    """No NaN, the exact mask, and the harness rule against the oracle (the family's tolerance: the
    relative rule only with 64 or more independent logits, as IndexerFamily.tolerance_for)."""
    s_kv = x["kv"].shape[0]
    assert not torch.isnan(out).any(), f"{what}: NaN (unwritten?) at {torch.isnan(out).nonzero()[:4].tolist()}"
    valid = range_mask(x["ks"], x["ke"], s_kv)
    wrong_mask = torch.isneginf(out) != ~valid
    assert not wrong_mask.any(), (f"{what}: mask differs at {wrong_mask.nonzero()[:4].tolist()} "
                                  f"(out {out[wrong_mask][:4].tolist()})")
    if not out.numel():  # S_kv = 0 (packed sequences of < 4 tokens): nothing to compare (the float
        return out       # rule's max() needs an element)
    ref, low = oracle_of(**x), lowprec_of(**x)
    independent = int(valid.any(-1).sum()) if ties else int(valid.sum())
    tol = FAMILY.tolerance if independent >= RELATIVE_MIN_LOGITS else Tolerance(rel_l2=float("inf"))
    ok, metrics = compare_outputs({"logits": out}, {"logits": ref}, {"logits": low}, lambda n: tol)
    assert ok, f"{what}: {metrics['logits'].summary()}"
    return ref


def _run(t, s_kv, p0=0, cfg=None, seed=0, ties=False, lens=None, ks=None, ke=None, n_split=None, n_ctas=None,
         out_pad=0, kv_pad=0):
    if lens is not None:
        ks, ke, s_kv = varlen_ranges(lens)
        t = ks.numel()
    elif ks is None:
        ks, ke = causal_ranges(t, s_kv, p0)
    x = make_inputs(t, s_kv, ks, ke, seed, "cuda", ties)
    if kv_pad:  # keys in rows of 128 + kv_pad bytes (a padded cache)
        buf = torch.zeros(s_kv, 128 + kv_pad, dtype=torch.float8_e4m3fn, device="cuda")
        buf[:, :128] = x["kv"]
        x["kv"] = buf[:, :128]
    cfg = cfg or choose_config(t, s_kv)
    out = torch.full((t, s_kv + out_pad), float("nan"), device="cuda")[:, :s_kv]
    run_logits(_compiled(cfg), cfg, **x, out=out, n_split=n_split, n_ctas=n_ctas)
    torch.cuda.synchronize()
    what = f"T={t} S_kv={s_kv} p0={p0} {cfg} split={n_split} ctas={n_ctas}"
    if out_pad:  # the row padding of the output buffer stays untouched
        assert torch.isnan(out.as_strided((t, out_pad), (s_kv + out_pad, 1), s_kv)).all(), \
            f"{what}: a store ran into the row padding"
    _check(out, x, what, ties)
    return out, x


SHAPES = [  # (T, S_kv, p0)
    (1, 1, 3), (2, 1, 0), (1, 5000, 19999), (3, 700, 2797), (5, 63, 0), (64, 63, 200), (129, 127, 600),
    (257, 129, 0), (300, 77, 0), (1000, 250, 0), (1001, 251, 3), (2047, 512, 0), (33, 1000, 3967),
    (4096, 1024, 0), (4097, 1031, 0), (8, 4096, 16380),
]


@pytest.mark.parametrize("t,s_kv,p0", SHAPES)
def test_rule(t, s_kv, p0):
    _run(t, s_kv, p0)


CONFIGS = [
    LogitsConfig(), LogitsConfig(bq=1), LogitsConfig(bq=4), LogitsConfig(n_wg=1), LogitsConfig(bq=1, n_wg=1),
    LogitsConfig(stages=2), LogitsConfig(q_stages=1), LogitsConfig(pingpong=True), LogitsConfig(bq=4, pingpong=True),
    LogitsConfig(bq=1, pingpong=True), LogitsConfig(pingpong=True, stages=3), LogitsConfig(n_wg=3),
    LogitsConfig(n_wg=4), LogitsConfig(n_wg=4, tile_wgs=2), LogitsConfig(n_wg=4, tile_wgs=1),
    LogitsConfig(n_wg=2, tile_wgs=1), LogitsConfig(overlap=2), LogitsConfig(overlap=3, bq=1),
    LogitsConfig(n_wg=2, tile_wgs=1, overlap=4), LogitsConfig(n_wg=1, overlap=2),
]
# the schedules: one tile shared by every warpgroup, groups taking tiles in turn (with and without
# ping-pong's turns), and two tiles in flight per warpgroup
SCHEDULES = [SHIPPED, LogitsConfig(), LogitsConfig(pingpong=True), LogitsConfig(n_wg=4), LogitsConfig(n_wg=4, tile_wgs=1),
             LogitsConfig(overlap=4), LogitsConfig(overlap=2)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("t,s_kv,p0", [(1, 1, 3), (5, 63, 0), (301, 333, 900), (1000, 250, 0), (7, 3000, 11990)])
def test_configs(cfg, t, s_kv, p0):
    _run(t, s_kv, p0, cfg)


@pytest.mark.parametrize("cfg", SCHEDULES, ids=str)
@pytest.mark.parametrize("n_split", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("t,s_kv,p0", [(8, 4096, 16380), (33, 1000, 3967), (300, 77, 0)])
def test_key_split(cfg, n_split, t, s_kv, p0):
    """Parts of one block's key tiles in different units (and parts with no tile at all)."""
    _run(t, s_kv, p0, cfg, n_split=n_split)


@pytest.mark.parametrize("cfg", SCHEDULES + [LogitsConfig(stages=2, q_stages=1)], ids=str)
@pytest.mark.parametrize("n_ctas", [1, 3, 7])
def test_persistent_few_ctas(cfg, n_ctas):
    """Many units per CTA: the Q and KV ring phases, the ping-pong turns and the fill warps carry over
    units (including units with no key tile)."""
    _run(1001, 251, 3, cfg, n_ctas=n_ctas)
    _run(64, 700, 2600, cfg, n_ctas=n_ctas, n_split=3)


@pytest.mark.parametrize("cfg", SCHEDULES, ids=str)
@pytest.mark.parametrize("lens", [[37, 3, 64, 9, 200], [4096], [1, 2, 3], [600, 5, 999, 130, 4]])
def test_varlen(cfg, lens):
    _run(0, 0, cfg=cfg, lens=lens)


@pytest.mark.parametrize("cfg", SCHEDULES, ids=str)
def test_arbitrary_and_out_of_range_ranges(cfg):
    """DeepGEMM's general ks / ke: random windows, empty ones, ks < 0 and ke > S_kv (clamped)."""
    g = torch.Generator().manual_seed(7)
    t, s_kv = 515, 1300
    a = torch.randint(-50, s_kv + 50, (t,), generator=g)
    b = a + torch.randint(-10, 900, (t,), generator=g)
    _run(t, s_kv, cfg=cfg, ks=a.int(), ke=b.int())


@pytest.mark.parametrize("cfg", [SHIPPED, LogitsConfig(), LogitsConfig(pingpong=True)], ids=str)
def test_ties(cfg):
    out, x = _run(200, 300, 1000, cfg, ties=True)
    for row in out:
        vis = row[torch.isfinite(row)]
        assert vis.numel() == 0 or (vis.max() - vis.min()) <= 1e-5 * vis.abs().max(), "all-equal keys, unequal logits"


def test_strided_output_and_padded_keys():
    _run(301, 333, 900, out_pad=5)
    _run(301, 333, 900, kv_pad=16)
    _run(301, 333, 900, LogitsConfig(pingpong=True), out_pad=3, kv_pad=128)
    _run(301, 333, 900, LogitsConfig(), out_pad=3, kv_pad=128)


def test_the_op_allocates_and_checks():
    from kernels.indexer.family import fp8_mqa_logits

    ks, ke = causal_ranges(300, 77)
    x = make_inputs(300, 77, ks, ke, 1, "cuda")
    _check(fp8_mqa_logits(**x), x, "op")
    with pytest.raises(ValueError, match="indexer: w must have shape"):
        fp8_mqa_logits(**{**x, "w": x["w"][:10]})


def test_matches_deepgemm():
    """Same contract, same inputs: ours and DeepGEMM's fp8_mqa_logits agree (both fp32 epilogues over
    FP8 wgmma products) and mask alike."""
    pytest.importorskip("deep_gemm")
    import deep_gemm

    for t, s_kv, p0 in [(4096, 1024, 0), (1001, 251, 3), (33, 1000, 3967)]:
        ks, ke = causal_ranges(t, s_kv, p0)
        x = make_inputs(t, s_kv, ks, ke, 2, "cuda")
        ours = torch.empty(t, s_kv, device="cuda")
        cfg = choose_config(t, s_kv)
        run_logits(_compiled(cfg), cfg, **x, out=ours)
        theirs = deep_gemm.fp8_mqa_logits(x["q"], (x["kv"], x["sc"]), x["w"], x["ks"], x["ke"])
        torch.cuda.synchronize()
        fin = torch.isfinite(theirs)
        assert torch.equal(torch.isneginf(ours), ~fin), f"T={t}: masks differ"
        rel = (ours[fin] - theirs[fin]).norm() / theirs[fin].norm()
        assert rel < 1e-3, f"T={t} S_kv={s_kv}: ours vs DeepGEMM rel L2 {rel:.3g}"


LOGITS_GRID = [p for p in space.production() if not (space.is_topk(p) or space.is_decode(p))]  # the other ops:
# tests/indexer/test_topk_family_gpu.py, tests/indexer/test_decode_gpu.py


@pytest.mark.parametrize("params", LOGITS_GRID + [space.causal(1, 1, 3), space.varlen([37, 3, 64, 9, 200])],
                         ids=lambda p: f"{p['model']}-{p['mask']}-t{p['t']}-s{p['s_kv']}")
@pytest.mark.parametrize("impl", ["cutedsl", "cutedsl:coop", "cutedsl:pingpong"])
def test_harness_path(params, impl, gpu_check):
    """The sweep's evaluation path: poisoned outputs between canary pads, inputs unchanged, the rule."""
    case = Case("indexer", params)
    outcome = gpu_check(case, get_impl("indexer", impl))
    out = outcome.result["logits"]
    ks, ke = case_ranges(params, "cuda")
    assert torch.equal(torch.isneginf(out), ~range_mask(ks, ke, params["s_kv"])), "mask differs"
