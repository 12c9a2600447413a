"""The fused decode top-k (select) on the CPU: its three wgmma steps compile clean for sm_90a (no
local memory, no serialised wgmma) and the bound and finish kernels compile; the family refuses
sm_100a; the oracle, the low-precision reference and the torch peer (the near-tie set rule: a wrong
pick fails it); the case space; the repair verdict read from the counts; bad input."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from kernels.common import compile_kernel
from kernels.indexer.config import fuse_select
from kernels.indexer.decode_glue import decode_reference, make_decode_inputs
from kernels.indexer.decode_sm90 import DecodeConfig
from kernels.indexer.select_glue import STEPS, check_select, compile_select, fake_step_args, repaired
from kernels.indexer.topk_glue import TOPK
from kernels.indexer.topk_select import CAP, LOWEST_VALID
from oracles.indexer import indexer_topk
from sweeps import indexer as space
from tests.wgmma_checks import assert_compiles_clean

FAMILY = get_family("indexer")
SELECT = {"op": ["select"]}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_each_wgmma_step_compiles_clean(step):
    assert_compiles_clean(lambda cfg: compile_kernel(STEPS[step](cfg), *fake_step_args(cfg), arch="sm_90a"),
                          DecodeConfig())


def test_the_whole_path_compiles_for_sm90_and_the_family_refuses_sm100():
    assert compile_select().names()[:5] == ("sample", "bound", "collect", "repair", "finish")
    case = Case("indexer", space.paged_select(2, 9000, 512))
    assert "wgmma" in get_impl("indexer", "cutedsl").supports(case, "sm_100a")


# ---------------- the reference and the rule ----------------

@pytest.mark.parametrize("params", [space.paged_select(3, 700, 100, [700, 5, 0]),
                                    space.paged_select(2, 300, 512, keys="equal"),
                                    space.paged_select(1, 9000, 512, table="shared")])
def test_oracle_lowprec_and_torch_pass_and_a_wrong_pick_fails(params):
    case = Case("indexer", params)
    data = CaseData(FAMILY, case, "cpu")
    tol = lambda n: FAMILY.tolerance_for(case, n)  # noqa: E731
    logits = decode_reference(**data.inputs, width=case["s_kv"])
    assert torch.equal(data.oracle["indices"], indexer_topk(logits, case["k"]).to(torch.int32))
    assert compare_outputs(data.lowprec, data.oracle, data.lowprec, tol)[0]
    out = get_impl("indexer", "torch").run(case, data.inputs, {}, None)
    ok, metrics = compare_outputs(out, data.oracle, data.lowprec, tol)
    assert ok, metrics["indices"].summary()
    if params.get("keys") != "equal":  # swap the best pick of request 0 for its worst valid key
        wrong = data.oracle["indices"].clone()
        row = logits[0]
        worst = int(torch.where(torch.isfinite(row), row, torch.inf).argmin())
        wrong[0][wrong[0] == int(row.argmax())] = worst
        assert not compare_outputs({"indices": wrong}, data.oracle, data.lowprec, tol)[0]


# ---------------- the case space ----------------

def test_production_select_shapes_are_decodes_with_each_models_k():
    cases = [c for c in FAMILY.cases(SweepOptions(examples=0, filters=SELECT))]
    assert len(cases) == 2 * len(space.DECODE_B) * len(space.DECODE_CTX)
    assert {(c["model"], c["k"]) for c in cases} == {(m, TOPK[m]) for m in space.MODELS}
    assert {c["s_kv"] for c in cases} == {ctx // 4 for ctx in space.DECODE_CTX}


def test_select_draws_reach_past_the_buffers_equal_keys_and_the_unfused_route():
    cases = [c.params for c in FAMILY.cases(SweepOptions(examples=60, grid=False, filters=SELECT))]
    assert len(cases) >= 50 and all(space.is_select(p) for p in cases)  # (repeated draws count once)
    assert any(max(space.decode_lens(p)) > CAP for p in cases)
    assert any(p.get("keys") == "equal" for p in cases)
    assert any(p["k"] > CAP // 4 for p in cases)
    assert all(space.visible_pairs(p) <= space.MAX_DRAWN_KEYS for p in cases)


def test_the_fused_kernels_run_only_where_they_won():
    assert fuse_select(8, 262144) and fuse_select(128, 131073)
    assert not any(fuse_select(b, w) for b, w in ((1, 262144), (7, 262144), (128, 131072), (128, 65536)))


# ---------------- the repair verdict ----------------

def test_repaired_reads_the_finishs_test_from_the_counts():
    kk = 512
    counts = torch.tensor([[300, 400, 123],  # 700 >= kk, bound set: held
                           [300, 100, 123],  # 400 < kk with a bound: repaired
                           [300, 100, LOWEST_VALID],  # every valid key taken: held
                           [CAP, 1, LOWEST_VALID],  # overflow: repaired
                           [CAP + 5000, 0, 123]], dtype=torch.int32)
    assert repaired(counts, kk).tolist() == [False, True, False, True, True]


# ---------------- bad input ----------------

def _ok():
    x = make_decode_inputs([3, 70], 70, seed=6)
    return {**x, "width": 70, "k": 16, "out": torch.empty(2, 16, dtype=torch.int32)}


@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.update(width=-1), "width must be an int"),
    (lambda a: a.update(width=70.0), "width must be an int"),
    (lambda a: a.update(k=0), "k must be in 1"),
    (lambda a: a.update(k=True), "k must be an int"),
    (lambda a: a.update(out=torch.empty(2, 70, dtype=torch.int32)), "out must have shape \\(2, 16\\)"),
    (lambda a: a.update(out=torch.empty(2, 16)), "out must be an int32 tensor"),
    (lambda a: a.update(q=a["q"].float()), "q must be torch.float8_e4m3fn"),
    (lambda a: a.update(lens=a["lens"][:1]), "lens must be contiguous \\[2\\]"),
    (lambda a: a.update(table=a["table"].long()), "table must be torch.int32"),
])
def test_bad_input_is_one_error_naming_the_argument(mutate, message):
    args = _ok()
    mutate(args)
    with pytest.raises(ValueError, match=f"indexer paged top-k: {message}"):
        check_select(**args)


def test_good_input_passes_the_checks():
    assert check_select(**_ok()) == (2, 16)
    assert check_select(**{**_ok(), "k": 512, "out": None}) == (2, 70)
