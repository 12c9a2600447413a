"""The indexer family's top-k op on the CPU: its cases (production grid, draws, and the logits cases
left as they were), the inputs' masks, the routing of every impl on `op`, the torch.topk peer's
selection against oracles/indexer.py `indexer_topk`, and the model adapter's handling of its
arguments (with a stand-in for the kernel call)."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4bench.compile.artifacts import artifact, compiled_functions
from dsv4bench.compile.cache import describe
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.filters import cases_under_filters
from dsv4bench.core.registry import ARCHS, SweepOptions, Unsupported, get_family, get_impl, impls
from kernels.indexer import serves
from kernels.indexer.family import SM90_ONLY, case_ranges
from kernels.indexer.peers import topk_by_index
from oracles.indexer import indexer_topk
from sweeps import indexer as space
from sweeps.common import draw

FAMILY = get_family("indexer")
TOPK = {"op": ["topk"]}

# The cases of the committed sweep benchmarks/results/indexer/2026-11-26-h100-b4a0a93 (`--examples 6`,
# seed 0): the production grid and the six draws.
COMMITTED_GRID = ["indexe-bfd3e977c3", "indexe-875e23eebb", "indexe-a5a2531f20", "indexe-dac653c2ce"]
COMMITTED_DRAWS = ["indexe-3bcfada4a6", "indexe-e7509c4d3e", "indexe-ebc7839362", "indexe-744c2a2b8a",
                   "indexe-38a4d8f740", "indexe-5c05fef038"]


def topk_case(*args, **kwargs) -> Case:
    return Case("indexer", space.topk(*args, **kwargs))


# ---------------- cases ----------------

def test_the_logits_cases_keep_their_ids():
    grid = [c.id for c in FAMILY.cases(SweepOptions(examples=0))
            if "op" not in c.params]
    assert grid == COMMITTED_GRID
    cases, _ = cases_under_filters(FAMILY, SweepOptions(examples=6, seed=0, filters={"op": ["logits"]}))
    drawn = [c.id for c in cases if c.origin == "hypothesis"]
    assert drawn == COMMITTED_DRAWS
    assert [p for p in space.extra(6, 0) if "op" not in p] == draw(space.extra_strategy(), 6, 0)
    assert [p for p in space.extra(6, 0) if space.is_topk(p)] == draw(space.topk_strategy(), 6, 0)


def test_production_topk_grid():
    grid = FAMILY.cases(SweepOptions(examples=0, filters=TOPK))
    prefill = [c for c in grid if c["mask"] == "causal"]
    decode = [c for c in grid if c["mask"] == "full"]
    assert len(grid) == len(prefill) + len(decode) == 2 * (2 + 3 * 4)
    assert {(c["model"], c["k"]) for c in grid} == {("flash", 512), ("pro", 1024)}
    assert {(c["t"], c["s_kv"]) for c in prefill} == {(4096, 1024), (16384, 4096)}
    assert {(c["t"], c["s_kv"]) for c in decode} == {(b, ctx // 4) for b in (1, 32, 128)
                                                     for ctx in (8192, 65536, 262144, 1048576)}
    assert max(FAMILY.cost(c).bytes for c in grid) <= 16384 * 4096 * 4 + 16384 * 1024 * 4  # 320 MiB


def test_extra_draws_every_op_interleaved_and_the_sweep_keeps_n():
    drawn = space.extra(8, 0)
    assert [p.get("op", "logits") for p in drawn] == ["logits", "topk", "decode", "select"] * 8
    cases, _ = cases_under_filters(FAMILY, SweepOptions(examples=12, seed=0, grid=False))
    assert len(cases) == 12 and sum(space.is_topk(c.params) for c in cases) == 3
    topk, _ = cases_under_filters(FAMILY, SweepOptions(examples=8, seed=0, grid=False, filters=TOPK))
    assert len(topk) == 8 and all(space.is_topk(c.params) for c in topk)


def test_topk_draws_reach_the_edges():
    """Over 300 draws: row lengths k - 1, k and k + 1, fewer valid than k, empty rows, every value
    kind and mask, k = 1; and each case's logits stay small (at most 4.2M)."""
    seen = set()
    for p in draw(space.topk_strategy(), 300, 0):
        assert p["t"] * p["s_kv"] <= 4104 * 1026, p
        ks, ke = case_ranges(p)
        for n in (ke - ks).tolist():
            seen |= {d for d in (-1, 0, 1) if n == p["k"] + d} | ({"below k"} if n < p["k"] else set())
            seen |= {"empty"} if n == 0 else set()
        seen |= {p["values"], p["mask"], f"k={p['k']}"}
    assert seen >= {-1, 0, 1, "below k", "empty", "randn", "bf16", "equal", "full", "causal", "ragged", "k=1"}


@pytest.mark.parametrize("params, valid", [
    (space.topk(9, 2, 512, "causal"), [0, 0, 0, 1, 1, 1, 1, 2, 2]),
    (space.topk(3, 5, 512, "full"), [5, 5, 5]),
    (space.ragged_topk([7, 0, 3], 7, 4), [7, 0, 3]),
])
@pytest.mark.parametrize("values", space.TOPK_VALUES)
def test_inputs_are_minus_inf_past_each_rows_valid_entries(params, valid, values):
    case = Case("indexer", {**params, "values": values})
    x = CaseData(FAMILY, case, "cpu").inputs["logits"]
    assert x.dtype == torch.float32 and x.shape == (len(valid), params["s_kv"])
    assert torch.isfinite(x).sum(-1).tolist() == valid
    for row, n in zip(x, valid):
        assert torch.isfinite(row[:n]).all() and torch.isneginf(row[n:]).all()
        if values == "equal" and n:
            assert (row[:n] == row[0]).all()
        if values == "bf16":
            assert torch.equal(row[:n], row[:n].bfloat16().float())


def test_bf16_values_tie_at_the_threshold():
    x = CaseData(FAMILY, topk_case(8, 65536, 1024, values="bf16"), "cpu").inputs["logits"]
    kth = x.topk(1024, dim=-1).values[:, -1:]
    assert ((x == kth).sum(-1) > 1).all()


# ---------------- routing ----------------

def test_topk_has_one_compile_key_apart_from_the_logits():
    ours = get_impl("indexer", "cutedsl")
    keys = {ours.compile_key(c, "sm_90a") for c in FAMILY.cases(SweepOptions(examples=10, filters=TOPK))}
    assert keys == {("indexer", "topk", "sm_90a")}
    logits = Case("indexer", space.causal(300, 75))
    assert ours.compile_key(logits, "sm_90a") not in keys


def test_the_topk_compile_is_recorded_from_each_of_its_kernels():
    """compile_topk gives a dispatcher of several compiled kernels: the sweep's compile record holds
    their total cubin size and the most registers and local memory of any one."""
    compiled = get_impl("indexer", "cutedsl").compile(topk_case(4, 5000, 512), "sm_90a")
    cubins = [parse_cubin(artifact(fn)) for fn in compiled_functions(compiled)]
    info = describe(compiled, 1.0, "miss")
    assert len(cubins) > 1 and info.cubin_bytes == sum(c.cubin_bytes for c in cubins)
    assert info.registers == max(c.registers for c in cubins) and info.local_bytes == 0


def test_who_takes_a_topk_case():
    case = topk_case(4, 5000, 512)
    assert all(get_impl("indexer", name).supports(case, arch) is None
               for name in ("cutedsl", "torch", "torch_compile") for arch in (None, *ARCHS))
    assert get_impl("indexer", "cutedsl").supports(Case("indexer", space.causal(4, 1)), "sm_100a") == SM90_ONLY
    reason = get_impl("indexer", "deepgemm").supports(case, "sm_90a")
    assert "DeepGEMM" in reason and "top-k" in reason and "torch.topk" in reason
    variants = [i for i in impls("indexer", variants=True) if i.variant and i.variant not in ("fused", "unfused")]
    assert variants
    for impl in variants:
        assert f"{impl.name} is a configuration of the logits kernel" in impl.supports(case, "sm_90a")
        assert impl.supports(Case("indexer", space.causal(300, 75)), "sm_90a") is None
    for name in ("cutedsl:fused", "cutedsl:unfused"):  # the select op's two routes, nothing else
        assert "route of a select case" in get_impl("indexer", name).supports(case, "sm_90a")
        assert get_impl("indexer", name).supports(Case("indexer", space.paged_select(2, 300, 16)), "sm_90a") is None


def test_outputs_tolerance_and_cost():
    case = topk_case(3, 700, 1024, values="bf16")
    out = FAMILY.alloc_outputs(case, "cpu")
    assert list(out) == ["indices"] and out["indices"].dtype == torch.int32 and out["indices"].shape == (3, 700)
    assert FAMILY.tolerance_for(case, "indices").index_set
    cost = FAMILY.cost(case)
    assert cost.flops == 0 and cost.bytes == 4 * 3 * 700 * 2
    big = topk_case(128, 262144, 1024)
    assert FAMILY.cost(big).bytes == 4 * 128 * (262144 + 1024)


@pytest.mark.parametrize("params", [space.topk(5, 3000, 512, values="bf16"),
                                    space.ragged_topk([0, 511, 512, 513, 600], 600, 512, "equal"),
                                    space.topk(41, 10, 1, "causal", "randn")])
def test_oracle_reference_and_a_wrong_answer(params):
    case = Case("indexer", params)
    data = CaseData(FAMILY, case, "cpu")
    ref = data.oracle["indices"]
    assert ref.dtype == torch.int32 and torch.equal(ref.long(), indexer_topk(data.inputs["logits"], case["k"]))
    assert torch.equal(data.lowprec["indices"], ref)
    tol = lambda n: FAMILY.tolerance_for(case, n)  # noqa: E731
    shuffled = ref[:, torch.randperm(ref.shape[1])]
    assert compare_outputs({"indices": shuffled}, data.oracle, data.lowprec, tol)[0]
    wrong = ref.clone()
    wrong[-1, 0] = params["s_kv"]  # not an entry of the row
    assert not compare_outputs({"indices": wrong}, data.oracle, data.lowprec, tol)[0]


# ---------------- the torch.topk peer ----------------

def _layout_ok(idx: torch.Tensor) -> bool:
    """Ascending indices, then the -1 slots."""
    last = torch.iinfo(torch.int64).max
    key = torch.where(idx < 0, last, idx.long())
    return bool(((key[:, 1:] > key[:, :-1]) | (key[:, 1:] == last)).all())


def _masked(x: torch.Tensor, lens) -> torch.Tensor:
    return x.masked_fill(torch.arange(x.shape[1]) >= torch.tensor(lens)[:, None], float("-inf"))


@pytest.mark.parametrize("k", [1, 7, 512])
def test_torch_peer_selects_the_oracles_set_on_distinct_values(k):
    """Distinct values (no ties): the same set as the oracle, in our layout, int32."""
    g = torch.Generator().manual_seed(k)
    x = torch.stack([torch.randperm(3000, generator=g).float() for _ in range(6)])
    x = _masked(x, [3000, 0, 1, k - 1, k, k + 1])
    got = topk_by_index(x, k)
    assert got.dtype == torch.int32 and got.shape == (6, min(k, 3000))
    assert torch.equal(got.long().sort(-1).values, indexer_topk(x, k).sort(-1).values)
    assert _layout_ok(got)


@pytest.mark.parametrize("values", ["bf16", "equal"])
def test_torch_peer_matches_the_oracle_up_to_ties_on_the_cpu(values):
    """With ties at the threshold the CPU's torch.topk may take other tied entries than the oracle's
    lowest indices (CUDA's takes them in index order: the GPU tests compare it exactly); the values
    selected and the -1 slots are the oracle's."""
    case = Case("indexer", space.ragged_topk([4000, 3000, 511, 513, 0], 4000, 512, values))
    x = CaseData(FAMILY, case, "cpu").inputs["logits"]
    got, ref = topk_by_index(x, 512).long(), indexer_topk(x, 512)
    assert _layout_ok(got.int())
    assert torch.equal((got < 0).sum(-1), (ref < 0).sum(-1))

    def picked(idx):
        return torch.where(idx >= 0, x.gather(-1, idx.clamp(min=0)), torch.full_like(x[:, :1], float("-inf")))
    assert torch.equal(picked(got).sort(-1).values, picked(ref).sort(-1).values)


def test_torch_peer_through_the_family():
    case = Case("indexer", space.ragged_topk([3000, 99, 100, 101], 3000, 100))
    data = CaseData(FAMILY, case, "cpu")
    out = get_impl("indexer", "torch").run(case, data.inputs, {}, None)
    assert compare_outputs(out, data.oracle, data.lowprec, lambda n: FAMILY.tolerance_for(case, n))[0]


# ---------------- the model adapter ----------------

class StandIn:
    """The kernel call `run(params, inputs)` of dsv4bench/model/kernel_ops.py, computed by the oracle."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, inputs):
        self.calls.append((params, inputs))
        return {"indices": indexer_topk(inputs["logits"], params["k"]).to(torch.int32)}


@pytest.mark.parametrize("shape, topk", [((2, 5, 300), 8), ((7, 40), 1024), ((40,), 3), ((1, 3, 0), 8), ((0, 9), 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adapter_flattens_rows_and_returns_the_oracles_shape(shape, topk, dtype):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(shape, generator=g).to(dtype)
    if scores.numel():
        scores.view(-1)[::3] = float("-inf")
    run = StandIn()
    got = serves.indexer_topk(run, scores, topk)
    ref = indexer_topk(scores.float(), topk)
    assert got.dtype == torch.int64 and got.shape == ref.shape
    assert torch.equal(got, ref)
    (params, inputs), = run.calls
    rows = math.prod(shape[:-1])
    assert params == {"op": "topk", "t": rows, "s_kv": shape[-1], "k": topk}
    assert inputs["logits"].dtype == torch.float32 and inputs["logits"].is_contiguous()
    assert inputs["logits"].shape == (rows, shape[-1])


def test_adapter_refuses_what_the_kernel_does_not_take():
    run = StandIn()
    with pytest.raises(Unsupported, match="indexer_topk: the kernel ranks float32 scores; torch.float64"):
        serves.indexer_topk(run, torch.zeros(2, 8, dtype=torch.float64), 4)
    with pytest.raises(ValueError, match="indexer top-k: k must be in 1..32768, got 0"):
        serves.indexer_topk(run, torch.zeros(2, 8), 0)
    with pytest.raises(ValueError, match="indexer top-k: k must be an int, got float"):
        serves.indexer_topk(run, torch.zeros(2, 8), 4.0)
    assert not run.calls


def test_the_family_serves_indexer_topk():
    assert FAMILY.serves == {"indexer_topk": serves.indexer_topk, "indexer_scores": serves.indexer_scores}
