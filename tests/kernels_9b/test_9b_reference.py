"""CPU checks of the router, quant and sampler families: tiling invariants of the kernels, the
tables the kernels share with the oracle, and each torch peer against the FP32 oracle on fresh
random inputs (the peers also serve as the families' low-precision references)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_family
from dsv4bench.core.worker import CaseData
from kernels.quant.quant import VEC, QuantConfig
from kernels.sampler.sampler import TILE, SamplerKernel, plan
from sweeps import quant as qspace
from sweeps import router as rspace
from sweeps import sampler as sspace


def run_reference(case: Case) -> tuple[CaseData, dict]:
    fam = get_family(case.family)
    data = CaseData(fam, case, "cpu")
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, lambda n: fam.tolerance_for(case, n))
    assert ok, {k: m.reasons for k, m in metrics.items()}
    return data, metrics


# ---------------------------------------------------------------- quant

@given(fmt=st.sampled_from(["fp8", "mxfp4"]), k=st.integers(1, 128), block=st.sampled_from([32, 64, 128]))
def test_quant_tiling_covers_each_row_once_with_aligned_block_groups(fmt, k, block):
    block = 32 if fmt == "mxfp4" else block
    cfg = QuantConfig.make(fmt, block * k, block)
    rows, cols = cfg.tiler(VEC)
    assert cols >= cfg.n > cols - VEC * cfg.threads_per_row  # no wholly idle pass over the row
    assert cfg.threads_per_row % cfg.lanes_per_block == 0  # a block's lanes share one shuffle group
    assert cfg.threads_per_row * rows == cfg.threads and cfg.threads <= 1024


def test_quant_config_refuses_what_the_kernel_cannot_do():
    for bad in [("fp8", 100, 128), ("mxfp4", 128, 64), ("fp8", 128, 48), ("fp8", 128, 512)]:
        with pytest.raises(ValueError):
            QuantConfig.make(*bad)
    with pytest.raises(ValueError):
        QuantConfig.make("mxfp4", 256, 32, rotate=True)


QUANT_CASES = [qspace.fp8(37, 7168), qspace.fp8(5, 448, 64, 512), qspace.fp8(1, 128),
               qspace.mxfp4(130), qspace.mxfp4(3, 96, rotate=False)]


@pytest.mark.parametrize("params", QUANT_CASES, ids=lambda p: f"{p['fmt']}-{p['m']}x{p['n']}-b{p['block']}")
def test_quant_peer_is_bit_exact_against_the_oracle(params):
    data, metrics = run_reference(Case("quant", params, 3))
    codes, scales = data.oracle["codes"], data.oracle["scales"]
    assert len(torch.unique(codes)) > 16 and len(torch.unique(scales)) >= min(3, scales.numel())  # formats exercised
    assert all(m.mismatches == 0 for m in metrics.values())


def test_quant_inputs_reach_both_amax_floors():
    data = CaseData(get_family("quant"), Case("quant", qspace.mxfp4(9, 64, rotate=False), 1), "cpu")
    scales = data.oracle["scales"]
    assert int(scales.min()) == 127 - 126  # the all-zero row: scale 2^-126 (FP4 floor)
    data = CaseData(get_family("quant"), Case("quant", qspace.fp8(9, 256), 1), "cpu")
    assert int(data.oracle["scales"][0].max()) == 127 - 22  # the tiny row: 2^ceil(log2(1e-4/448)) = 2^-22


@given(params=qspace.extra_strategy())
def test_quant_hypothesis_cases_pass_on_cpu(params):
    if params["m"] * params["stride"] > 2_000_000:
        params = {**params, "m": 7}
    run_reference(Case("quant", params, 0))


# ---------------------------------------------------------------- router

@pytest.mark.parametrize("params", [rspace.case(257, 384, 2.5, False), rspace.case(64, 256, 1.5, True),
                                    rspace.case(3, 40, 1.0, False, k=8)], ids=str)
def test_router_peer_matches_the_oracle(params):
    data, metrics = run_reference(Case("router", params, 4))
    w, idx = data.oracle["weights"], data.oracle["indices"]
    assert torch.allclose(w.sum(-1), torch.full_like(w[:, 0], params["scale"]), rtol=1e-12)  # fp64 truth
    assert int(idx.min()) >= 0 and int(idx.max()) < params["e"]
    from kernels.router.eager import route_from_logits

    peer = route_from_logits(data.inputs["logits"], data.inputs.get("bias"), data.inputs.get("tid2eid"),
                             data.inputs.get("input_ids"), params["k"], params["scale"])
    assert torch.equal(peer["indices"].long(), idx)
    assert float((peer["weights"] - w).abs().max()) <= 4 * torch.finfo(torch.float32).eps * params["scale"]
    assert torch.equal(peer["weights"], data.lowprec["weights"])  # the peer is the oracle's fp32 route


def test_router_bias_changes_selection_but_not_weights():
    case = Case("router", rspace.case(512, 256, 1.5, False), 2)
    data = CaseData(get_family("router"), case, "cpu")
    scores = torch.nn.functional.softplus(data.inputs["logits"]).sqrt()
    unbiased_top = scores.topk(6, dim=-1).indices.sort(-1).values
    assert (unbiased_top != data.oracle["indices"].sort(-1).values).any(dim=-1).float().mean() > 0.2
    picked = scores.gather(-1, data.oracle["indices"])
    assert torch.allclose(data.oracle["weights"].float(), picked / picked.sum(-1, keepdim=True) * 1.5)


# ---------------------------------------------------------------- sampler

@pytest.mark.parametrize("params", [sspace.case(5, 0.6), sspace.case(7, 0.0), sspace.case(9, 1e-6, 1028),
                                    sspace.case(3, 2.0, 4)], ids=str)
def test_sampler_noise_contract_peer_equals_oracle(params):
    run_reference(Case("sampler", params, 6))


def test_sampler_greedy_inputs_have_ties_and_the_oracle_takes_the_lowest_index():
    data = CaseData(get_family("sampler"), Case("sampler", sspace.case(16, 0.0), 1), "cpu")
    logits = data.inputs["logits"]
    top = logits.max(-1, keepdim=True).values
    tied = (logits == top).sum(-1) > 1
    assert tied.any()  # bf16-rounded logits: T = 0 must break ties
    first = (logits == top).int().argmax(-1)  # first index of the maximum
    assert torch.equal(data.oracle["tokens"], first)


def test_sampler_temperature_changes_tokens():
    fam = get_family("sampler")
    cold = CaseData(fam, Case("sampler", sspace.case(64, 0.0), 2), "cpu").oracle["tokens"]
    hot = CaseData(fam, Case("sampler", sspace.case(64, 1.0), 2), "cpu").oracle["tokens"]
    assert (cold != hot).float().mean() > 0.5


def test_sampler_splits_cover_the_vocabulary():
    for v in (4, 1024, 1028, 129280, 160000):
        tiles = SamplerKernel(v).tiles
        assert tiles == -(-v // TILE)
        for rows in (1, 5, 64, 300):
            per_split, splits = plan(rows, tiles)
            assert (splits - 1) * per_split < tiles <= splits * per_split
    with pytest.raises(ValueError):
        SamplerKernel(1022)
