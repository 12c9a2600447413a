"""The moe family on the CPU: the dispatch layout reference, the expert loads, the oracle's duplicate
entries, the FP8 conversion of the DeepGEMM peer, the memory of the production cases, bad arguments,
and fresh compiles of the dispatch and combine kernels (sm_90a, no local memory)."""

from __future__ import annotations

import re

import pytest
import torch

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from kernels.moe.glue import (alloc_dispatch, check_combine, check_dispatch, check_fits, compile_combine,
                              compile_dispatch)
from kernels.moe.inputs import counts, expert_bytes, layout_rows, make_experts, routing
from kernels.moe.peers import conversion_error, dequant_stack
from oracles.moe import ExpertWeights, contiguous_rows, dispatch_layout, expert, gather_quant, routed
from oracles.quant import fp8_block_quant
from sweeps import moe as space

CASE_BUDGET = 10e9


def _case(**kw) -> Case:
    return Case("moe", {**space.case("dispatch", "drawn", 64, e=16, d=256, i=128), **kw})


def test_contiguous_layout_segments_are_tile_aligned_and_keep_token_order():
    idx = torch.tensor([[2, 0, 2], [1, 2, 5], [2, 0, 0]], dtype=torch.int32)  # 5: not routed (E = 4)
    w = torch.arange(9, dtype=torch.float32).view(3, 3)
    rows = contiguous_rows(3, 3, 4, 4)
    lay = dispatch_layout(idx, w, 4, rows, None, tile=4)
    assert lay["counts"].tolist() == [3, 1, 4, 0]
    # expert 0 rows 0-3 (3 entries + 1 pad), expert 1 rows 4-7, expert 2 rows 8-11
    assert lay["src"].tolist()[:12] == [0, 2, 2, -1, 1, -1, -1, -1, 0, 0, 1, 2]
    assert lay["expert"].tolist()[:12] == [0, 0, 0, -1, 1, -1, -1, -1, 2, 2, 2, 2]
    assert lay["pos"].tolist() == [[8, 0, 9], [4, 10, -1], [11, 1, 2]]
    assert lay["row_weight"][8].item() == 0 and lay["row_weight"][9].item() == 2
    assert (lay["src"][12:] == -1).all() and rows >= 12


def test_masked_layout_drops_entries_past_max_m_and_the_glue_refuses_them():
    idx = torch.tensor([[0, 1], [0, 1], [0, 2]], dtype=torch.int32)
    lay = dispatch_layout(idx, torch.ones(3, 2), 3, 3 * 2, max_m=2)
    assert lay["counts"].tolist() == [3, 2, 1]
    assert lay["pos"].tolist() == [[0, 2], [1, 3], [-1, 4]]
    with pytest.raises(ValueError, match="max_m=2 is too small"):
        check_fits(lay["counts"], 2)


def test_gather_quant_is_the_reference_act_quant_and_scales_are_mn_major():
    x = torch.randn(5, 256).bfloat16()
    src = torch.tensor([3, -1, 0, 4, -1, -1], dtype=torch.int32)
    codes, scales = gather_quant(x, src)
    q, s = fp8_block_quant(x[[3, 0, 4]], 128)
    assert torch.equal(codes[[0, 2, 3]], q.view(torch.uint8)) and torch.equal(scales[:, [0, 2, 3]], s.t())
    assert (codes[[1, 4, 5]] == 0).all() and (scales[:, [1, 4, 5]] == 0).all()
    codes, scales = gather_quant(x, src, groups=2)
    assert scales.shape == (2, 2, 3)


@pytest.mark.parametrize("load", space.LOADS)
def test_loads_are_deterministic_and_shaped_as_named(load):
    case = _case(load=load, t=200)
    idx, w = routing(case)
    assert torch.equal(idx, routing(case)[0]) and idx.shape == (200, 6)
    assert torch.allclose(w.sum(-1), torch.full((200,), case["scale"]))
    c = counts(case)
    distinct = torch.tensor([len(set(r)) for r in idx.tolist()])
    if load == "hot":
        assert c[0] == 200
    if load == "sparse":
        assert (c[6:] == 0).all()
    if load == "hash":
        assert (distinct < 6).any()  # a token hits one expert twice
    else:
        assert (distinct == 6).all()


def test_routed_oracle_counts_a_duplicate_entry_twice():
    gen = torch.Generator().manual_seed(0)
    ex = make_experts(2, 128, 128, gen, "cpu")
    x = torch.randn(2, 128).bfloat16()
    idx = torch.tensor([[1, 1], [0, 1]])
    w = torch.tensor([[0.5, 0.25], [1.0, 1.0]])
    y = routed(x, w, idx, ex)
    want0 = expert(x[:1], ex[1], w[:1, :1]) + expert(x[:1], ex[1], w[:1, 1:])
    assert torch.allclose(y[0], want0[0], rtol=1e-5, atol=1e-5)
    assert isinstance(ex[0], ExpertWeights)


def test_fp8_block_conversion_is_exact_on_the_synthetic_weights_and_loses_wide_blocks():
    ex = make_experts(2, 256, 128, torch.Generator().manual_seed(1), "cpu")
    assert conversion_error(dequant_stack(ex, "w1"))[0] == 0
    w = dequant_stack(ex, "w2").clone()
    w[0, 0, 0] = 6.0 * 2.0**12  # one block spans > 14 binades: its smallest values underflow
    changed, worst = conversion_error(w)
    # block scale 2^6 (6·2^12 / 448 rounded up): the rest round to e4m3 subnormal steps of 2^6 · 2^-9
    assert changed > 0 and worst <= 2.0**6 * 2.0**-10


def _device_bytes(case: Case) -> float:
    """Peak device memory of a layer case: inputs twice (the harness keeps a copy), the DeepGEMM FP8
    copy (2x the FP4 codes) and the bf16 copy (4x), the layout (codes, L1 / L2 outputs in bf16),
    and one expert's fp32 dequantisation (the oracle)."""
    e, d, i, t = case["e"], case["d"], case["i"], case["t"]
    weights = e * expert_bytes(d, i)
    rows = layout_rows(case)
    acts = rows * (d + 2 * 2 * i + 2 * d + i) + 4 * t * d * 2
    return 2 * weights + 2 * weights + 4 * weights + acts + 3 * d * i * 4


def test_every_production_layer_case_fits_the_memory_budget():
    cases = [Case("moe", p) for p in space.production() if p["op"] == "layer"]
    worst = max(cases, key=_device_bytes)
    assert _device_bytes(worst) < CASE_BUDGET, (worst, _device_bytes(worst) / 1e9)


def test_bad_arguments_name_themselves():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    idx = torch.zeros(4, 6, dtype=torch.int32)
    w = torch.zeros(4, 6)
    out = alloc_dispatch(4, 6, 8, 256, None, "cpu")
    check_dispatch(x, idx, w, out, 8, None)
    with pytest.raises(ValueError, match="^x must"):
        check_dispatch(x[:, :200], idx, w, out, 8, None)
    with pytest.raises(ValueError, match="^idx must"):
        check_dispatch(x, idx.long(), w, out, 8, None)
    with pytest.raises(ValueError, match="^weights must"):
        check_dispatch(x, idx, w.double(), out, 8, None)
    with pytest.raises(ValueError, match=r"^out\['scales'\] must"):
        check_dispatch(x, idx, w, {**out, "scales": out["scales"].t()}, 8, None)
    with pytest.raises(ValueError, match="^pos must"):
        check_combine(torch.zeros(8, 256, dtype=torch.bfloat16), idx[:3], x, x)
    with pytest.raises(ValueError, match="^y must"):
        check_combine(torch.zeros(8, 256, dtype=torch.bfloat16), idx, x, x.float())
    with pytest.raises(ValueError, match="^load="):
        routing(_case(load="bursty"))


@pytest.mark.parametrize("n_experts, d, layout, skip", [(64, 4096, "contiguous", False), (24, 7168, "masked", False),
                                                   (3, 384, "masked", False), (64, 4096, "masked", True)])
def test_dispatch_compiles_without_local_memory(n_experts, d, layout, skip):
    info = parse_cubin(artifact(compile_dispatch(n_experts, 6, d, layout, skip_padding=skip)))
    assert info.local_bytes == 0 and 0 < info.registers <= 128


@pytest.mark.parametrize("n_experts, d, arch", [(256, 4096, "sm_90a"), (384, 7168, "sm_90a"), (8, 128, "sm_90a"),
                                              (256, 4096, "sm_100a")])
def test_fused_dispatch_compiles_and_only_for_the_layers_masked_layout(n_experts, d, arch, monkeypatch):
    """v14's one-launch dispatch (kernels/moe/dispatch_fused.py): no local memory at Flash / Pro widths and a 16-lane
    row group (D 128); refused off the layer's masked skip-padding layout. The rule's layer compiles it beside the
    two-kernel dispatch with fused_max MAX_ASSIGNMENTS; `cutedsl:v13` and the contiguous layout do not; a call
    launches it up to fused_max T·k assignments."""
    compiled = compile_dispatch(n_experts, 6, d, "masked", arch, skip_padding=True, pdl=True, fused=True)
    if arch == "sm_90a":
        info = parse_cubin(artifact(compiled))
        assert info.local_bytes == 0 and 0 < info.registers <= 128
    for layout, skip in (("contiguous", True), ("masked", False)):
        with pytest.raises(ValueError, match="^fused is the layer's masked dispatch"):
            compile_dispatch(8, 6, 256, layout, skip_padding=skip, fused=True)
    from dsv4bench.core.registry import get_impl
    from kernels.moe import layer
    from kernels.moe.dispatch_fused import MAX_ASSIGNMENTS
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: ("dispatch", fused))
    monkeypatch.setattr(layer, "compile_grouped", lambda *a, **k: None)
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: None)
    for impl, layout, fused_max in (("cutedsl", "masked", MAX_ASSIGNMENTS), ("cutedsl:v13", "masked", 0),
                                    ("cutedsl", "contiguous", 0), ("cutedsl:v13", "contiguous", 0),
                                    ("cutedsl:fused-dispatch", "masked", 1 << 30)):
        compiled = layer.compile_layer(8, 6, 512, 256, layout, **get_impl("moe", impl).knobs)
        assert compiled.fused_max == fused_max and compiled.kernels["dispatch"] == ("dispatch", False)
        assert compiled.kernels.get("dispatch@fused") == (("dispatch", True) if fused_max else None)
    assert 48 <= MAX_ASSIGNMENTS < 384  # measured: T = 8 (48) gains, T = 64 (384) loses


def _sass_lines(compiled) -> list[str]:
    from dsv4bench.compile.sass import sass_of
    text = sass_of(compiled)
    if text is None:
        pytest.skip("no nvdisasm here")
    return [line for line in text.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]


def test_v29_reads_combines_pos_and_dispatchs_x_ahead_of_their_waits(monkeypatch):
    """v29's launch edges (the rule since session 49). combine (early): the token's 6 pos words and its shared vector
    are loaded before griddepcontrol.wait (ACQBULK), only the 6 rows after it; v27's waits before any load. The fused
    dispatch (early_x): x's vector is loaded before the rank's warp reduction (SHFL), v27's after it. Both refused
    outside their launch form; the rule compiles them into the layer (v5's L1s with route_first, the wide pair without),
    `cutedsl:v27` does not."""
    def order(lines, first, then):
        return next(i for i, l in enumerate(lines) if first in l) < next(i for i, l in enumerate(lines) if then in l)

    for early in (False, True):
        lines = _sass_lines(compile_combine(4096, 6, "sm_90a", pdl=True, early=early))
        wait = next(i for i, l in enumerate(lines) if "ACQBULK" in l)
        loads = [i for i, l in enumerate(lines) if "LDG" in l]
        assert sum(i < wait for i in loads) == (7 if early else 0) and sum(i > wait for i in loads) >= 6
        disp = _sass_lines(compile_dispatch(256, 6, 4096, "masked", skip_padding=True, pdl=True, fused=True,
                                            early_x=early))
        assert order(disp, "LDG.E.128", "SHFL.BFLY") == early
        assert not any("STL" in line for line in disp)
    with pytest.raises(ValueError, match="pdl"):
        compile_combine(4096, 6, early=True)
    with pytest.raises(ValueError, match="early_x"):
        compile_dispatch(8, 6, 256, "masked", skip_padding=True, early_x=True)
    from dsv4bench.core.registry import get_impl
    from kernels.moe import layer
    seen = {}
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, fused=False, early_x=False, **k: ("dispatch", early_x))
    monkeypatch.setattr(layer, "compile_grouped", lambda *a, **k: seen.setdefault(len(seen), (a[1], k)))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, early=False: ("combine", early))
    for impl, on in (("cutedsl:v27", False), ("cutedsl", True)):
        seen.clear()
        compiled = layer.compile_layer(8, 6, 512, 256, "masked", **get_impl("moe", impl).knobs)
        assert compiled.kernels["combine"] == ("combine", on) and compiled.kernels["dispatch@fused"][1] == on
        firsts = [k.get("route_first", False) for epi, k in seen.values() if epi == "swiglu"]
        assert firsts == [on, on, False, on, False]  # bm 16, bm 32, the wide pair, the split, the wide split


@pytest.mark.parametrize("d", [4096, 7168, 384])
def test_combine_compiles_without_local_memory(d):
    info = parse_cubin(artifact(compile_combine(d, 6)))
    assert info.local_bytes == 0 and 0 < info.registers <= 128


def test_experts_option_adds_the_real_layer_and_the_bf16_peers_refuse_what_they_cannot_hold():
    """`sweep moe --model pro --tokens 4096 --experts 384`: the grid's capped case at the model's 384 experts
    (origin cli); the bf16 peers refuse its 54 GB copy, DeepGEMM's kernels take it."""
    from dsv4bench.core.registry import SweepOptions, get_family, get_impl

    opts = SweepOptions(examples=0, filters={"op": ["layer"], "model": ["pro"], "tokens": [4096], "experts": [384]})
    cases = get_family("moe").cases(opts)
    assert [(c["e"], c["load"], c.origin) for c in cases] == [(384, load, "cli") for load in space.LOADS]
    assert "54 GB" in get_impl("moe", "torch_grouped_mm").supports(cases[0]) and get_impl("moe", "torch").supports(cases[0])
    assert get_impl("moe", "deepgemm-kernels").supports(cases[0], "sm_90a") is None
    assert get_impl("moe", "torch").supports(Case("moe", space.case("layer", "pro", 4096))) is None  # 16 experts
    # past the masked work list's 512 experts a decode case is refused in one line, prefill still runs
    decode = Case("moe", space.case("layer", "flash", 8, e=600))
    assert "at most 512" in get_impl("moe", "cutedsl").supports(decode, "sm_90a")
    assert get_impl("moe", "cutedsl").supports(Case("moe", space.case("layer", "flash", 4096, e=600)), "sm_90a") is None
