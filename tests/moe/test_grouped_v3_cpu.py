"""v3 (prefill) of the grouped expert GEMM on the CPU (kernels/moe/grouped_split.py; docs/perf/moe.md "v3"):
the row-frame weights (exact, one column scale per row, the same model output bit for bit as
the block frame), the split widening's items (every (row, sub-block) of the tile once, each warpgroup only
its own wgmma's rows, the v2 widening's source and swizzled destination), the variants' declarations and
the layer handing v3 the row-frame weights, and sm_90a compiles (no serialised wgmma; no local memory at
decode; inside the prefill K-block loop at most the spill refills the v2 kernel has)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from kernels.moe.expert_weights import (EXACT_SPAN, flush_stats, prepare, prepare_layer, rs_byte_order,
                                        rs_sign_layout, widened_dequant)
from kernels.moe.grouped_config import V2, V3, V7, GroupedConfig
from kernels.moe.inputs import make_experts
from kernels.moe.layer import compile_grouped, grouped_config
from oracles.moe import dispatch_layout, gather_quant
from oracles.quant import mxfp4_dequant, unpack_fp4
from sweeps import moe as space
from tests.moe import grouped_model as model
from tests.moe.compile_checks import compile_checked

SPLIT = {**V2, "split_wg": True}  # the decoupling alone (v2's frame and epilogue): the tile rule's prefill pick is V3


def _codes(e, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)


@pytest.mark.parametrize("span", [1, 3, 8, EXACT_SPAN])
def test_row_frame_is_exact_within_14_binades_a_row(span):
    """Exponents spanning up to 14 binades over a whole row (across K blocks, not only within one): the
    row-frame bracket widens exactly and its column scale is one value per row, equal in every K block."""
    e, n, k = 2, 16, 1024
    g = torch.Generator().manual_seed(span)
    exps = 110 + torch.randint(0, span + 1, (e, n, k // 32), generator=g)
    exps[:, :, 0] = 110 + span  # the row max somewhere, the row min elsewhere: the full span in every row
    exps[:, :, -1] = 110
    codes = _codes(e, n, k, span)
    w = prepare(codes, exps.to(torch.uint8), frame="row")
    assert flush_stats(exps.to(torch.uint8), "row")[0] == 0
    assert torch.equal(widened_dequant(w), mxfp4_dequant(unpack_fp4(codes), exps.to(torch.uint8)))
    assert (w.col_scale == w.col_scale[:, :1]).all()  # [E, KB, N]: the same along KB


def test_row_frame_beyond_14_binades_is_counted_and_bounded():
    """A sub-block 15 binades below its row's max but within 14 of its own K block's: exact in the block
    frame, inexact (counted, within half an e4m3 subnormal step of the row factor) in the row frame."""
    exps = torch.full((1, 1, 8), 100)
    exps[0, 0, :4] = 115  # K block 0 at 115, K block 1 at 100: a 15-binade row span
    exps = exps.to(torch.uint8)
    codes = _codes(1, 1, 256, 7)
    exact = mxfp4_dequant(unpack_fp4(codes), exps)
    assert flush_stats(exps, "block")[0] == 0 and flush_stats(exps, "row") == (4, 8)
    assert torch.equal(widened_dequant(prepare(codes, exps)), exact)
    w = prepare(codes, exps, frame="row")
    diff = (widened_dequant(w) - exact).abs()
    assert diff[..., :128].max() == 0 and diff[..., 128:].max() > 0
    assert (diff <= w.col_scale[0, 0, 0] * 2.0**-10).all()
    with pytest.raises(ValueError, match="frame"):
        prepare(codes, exps, frame="column")


@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_row_frame_model_output_equals_the_block_frame_bit_for_bit(layout):
    """The kernel's math (tests/moe/grouped_model) on row-frame weights: each K block's products and its
    column scale differ from the block frame's by one power of two each way, so L1's h (codes, scales) and
    L2's rows are the same bits."""
    e, d, i, t = 4, 512, 256, 37
    g = torch.Generator().manual_seed(3)
    ex = make_experts(e, d, i, g, "cpu")
    x = (torch.randn(t, d, generator=g) * 2).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]).int()
    idx = torch.cat([idx, idx[:, :2]], 1)
    w = torch.rand(t, 6, generator=g)
    max_m = 80 if layout == "masked" else None
    rows = e * max_m if max_m else t * 6 + 127 * e
    lay = dispatch_layout(idx, w, e, rows, max_m)
    codes, scales = gather_quant(x, lay["src"], e if max_m else 1)
    outs = {}
    for frame in ("block", "row"):
        l1, l2 = prepare_layer(ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2, frame=frame)
        h, hs = model.layer1(lay, codes, scales, l1, max_m)
        outs[frame] = (h, hs, model.layer2(lay, h, hs, l2))
    for a, b in zip(outs["block"], outs["row"]):
        assert torch.equal(a, b)


def _split_items(bn=256, wgs=2, subs=4, stage=1, buf=1, n_stages=4):
    """GroupedSplit._widen_stage's index arithmetic in Python: per consumer thread and step, (row n, sub-block
    j, 16-byte source vector, the two 16-byte destination chunks)."""
    rows = bn // wgs
    out = []
    for ctid in range(128 * wgs):
        half, lt = divmod(ctid, 128)
        n0, j = half * rows + lt // subs, lt % subs
        src0 = stage * (bn * 4) + n0 * subs + j
        dst0 = buf * (bn * 8) + n0 * 8
        dn = 128 // subs
        for step in range(rows * subs // 128):
            n = n0 + step * dn
            out.append((ctid, n, j, src0 + step * 128,
                        tuple(dst0 + step * (dn * 8) + ((2 * j + h) ^ (n0 % 8)) for h in range(2))))
    return out


def _v2_items(bn=256, wgs=2, subs=4, stage=1, buf=1):
    """GroupedSm90._widen_v2's (the shipped widening's) arithmetic, the same records."""
    out = []
    for ctid in range(128 * wgs):
        for step in range(bn * subs // (128 * wgs)):
            item = step * 128 * wgs + ctid
            n, j = divmod(item, subs)
            out.append((ctid, n, j, stage * (bn * 4) + item,
                        tuple(buf * (bn * 8) + n * 8 + ((2 * j + h) ^ (n % 8)) for h in range(2))))
    return out


def test_split_widening_covers_the_tile_once_each_warpgroup_its_own_rows():
    split, v2 = _split_items(), _v2_items()
    # the same (row, sub-block) -> (source, destination) map as v2's, every item once
    assert sorted(r[1:] for r in split) == sorted(r[1:] for r in v2)
    assert len({(r[1], r[2]) for r in split}) == 256 * 4 == len(split)
    for ctid, n, *_ in split:  # warpgroup h writes only rows [128 h, 128 h + 128): what its wgmma reads
        assert n // 128 == ctid // 128
    # bank-conflict-free stores as in v2: a quarter-warp's 8 threads cover the 32 banks with each chunk
    for q in range(0, 256, 8):
        for step in range(4):
            for h in range(2):
                chunks = [r[4][h] for r in split if q <= r[0] < q + 8 and (r[1] % 128) // 32 == step]
                assert sorted((c * 16 // 4) % 32 // 4 for c in chunks) == list(range(8)), (q, step, h)


def test_rs_code_items_read_their_sub_block_through_the_swizzle_without_bank_conflicts():
    """v3 on v5's RS-ordered tiles (rs_codes, GroupedSplit._load_rs_item): under TMA's 64B swizzle (row n's chunk q
    at q ^ ((n >> 1) & 3)) thread (row n, sub-block j)'s word q holds the plain bytes 16j + 2q, + 1, 16j + 8 + 2q, + 1
    in the sign layout (codes 4q .. + 3 and 16 + 4q .. + 3 of the sub-block: widen_item_rs's lo and hi of chunk word
    q), and each of
    a warp's 4 word loads of a step hits 32 distinct banks."""
    bn = 256
    plain = _codes(1, bn, 128, seed=3)[0]
    rs = rs_sign_layout(plain[:, rs_byte_order()].contiguous())
    smem = torch.empty_like(rs)
    for n in range(bn):
        for q in range(4):
            p = q ^ ((n >> 1) & 3)
            smem[n, 16 * p:16 * p + 16] = rs[n, 16 * q:16 * q + 16]
    words = smem.contiguous().view(torch.int32).view(-1)
    seen = set()
    for ctid in range(256):
        n0, j = (ctid // 128) * 128 + (ctid % 128) // 4, ctid % 4
        for step in range(4):
            n = n0 + 32 * step
            seen.add((n, j))
            for q in range(4):
                got = int(words[n * 16 + j + 4 * (q ^ ((n >> 1) & 3))])
                b = [int(plain[n, 16 * j + o]) for o in (2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q)]
                want = rs_sign_layout(torch.tensor(b, dtype=torch.uint8)).view(torch.int32).item()
                assert got == want, (n, j, q)
    assert len(seen) == bn * 4
    for warp in range(8):
        for step in range(4):
            for q in range(4):
                banks = set()
                for ctid in range(32 * warp, 32 * warp + 32):
                    n = (ctid // 128) * 128 + (ctid % 128) // 4 + 32 * step
                    banks.add((n * 16 + ctid % 4 + 4 * (q ^ ((n >> 1) & 3))) % 32)
                assert len(banks) == 32, (warp, step, q)


def test_v3_variants_are_declared_and_validated():
    assert get_impl("moe", "cutedsl:split-wg").knobs == SPLIT
    assert get_impl("moe", "cutedsl:v3").knobs == V3
    assert get_impl("moe", "cutedsl:v3").checked
    case = Case("moe", space.case("layer", "flash", 4096))
    assert get_impl("moe", "cutedsl:v3").supports(case, "sm_90a") is None
    with pytest.raises(ValueError, match="row_frame"):
        GroupedConfig(layout="contiguous", bm=128, row_frame=True)
    with pytest.raises(ValueError, match="fast_silu"):
        GroupedConfig(layout="contiguous", bm=128, fast_silu=True)
    assert get_impl("moe", "cutedsl:v2").knobs == V2 and get_impl("moe", "cutedsl:v2").checked
    assert get_impl("moe", "cutedsl:v3-rs").knobs == {**V3, "rs_codes": True}
    assert GroupedConfig(layout="contiguous", bm=128, **{**V7, "rs_codes": True}).codes == "rs"
    with pytest.raises(ValueError, match="rs_codes"):
        GroupedConfig(layout="contiguous", bm=128, rs_codes=True)
    with pytest.raises(ValueError, match="rs_codes"):
        GroupedConfig(layout="contiguous", bm=128, **{**V3, "rs_codes": True, "tiled_b": True})


@pytest.mark.parametrize("epilogue", ["swiglu", "bf16"])
def test_the_tile_rule_picks_v7_at_prefill_and_v5_at_decode(epilogue):
    """v8 (docs/perf/moe.md "v8"): contiguous (prefill) -> v7 (v3: split warpgroups, row-frame weights, fast silu;
    with all-padding second waves skipped), masked (decode) -> v5 (swap-AB, 16-token tiles; compile_layer adds 32),
    both on row-frame weights and the RS code tiles. The v2 A/Bs and cutedsl:v4 turn v5 off and get v2's 64-row
    decode wave on block-frame weights; cutedsl:v5 / cutedsl:v7 keep the block frame / the plain codes."""
    from kernels.moe.grouped_config import V4, V5, V27_DECODE, choose
    from kernels.moe.layer import grouped_config, weight_frame
    pre, dec = choose("contiguous", epilogue), choose("masked", epilogue)
    assert (pre.split_wg, pre.row_frame, pre.fast_silu, pre.bm, pre.swap_ab) == (True, True, True, 128, False)
    assert pre.skip_padding_wave and not grouped_config("contiguous", epilogue, **V3).skip_padding_wave
    assert dec == GroupedConfig(layout="masked", epilogue=epilogue, bm=16, pdl=True, **V27_DECODE) and dec.swap_ab
    assert pre.codes == dec.codes == "rs" and weight_frame("contiguous") == weight_frame("masked") == "row"
    assert weight_frame("masked", **V5) == "block" and grouped_config("contiguous", epilogue, **V7).codes == "plain"
    v2_dec = GroupedConfig(layout="masked", epilogue=epilogue, bm=64, **V2)
    assert grouped_config("masked", epilogue, **V4) == replace(v2_dec, skip_idle_warps=True)
    # cutedsl:v2 and every v2 A/B are v2 at both layouts; v3, split-wg as were
    for name in ("v2", "serial", "ko-no-widen", "tiled-b", "pdl"):
        knobs = get_impl("moe", f"cutedsl:{name}").knobs
        cfg = grouped_config("contiguous", epilogue, **knobs)
        assert not (cfg.split_wg or cfg.row_frame or cfg.fast_silu or cfg.swap_ab), name
        assert grouped_config("masked", epilogue, **knobs) == replace(v2_dec, **{
            k: v for k, v in knobs.items() if k not in V2}), name
        assert weight_frame("contiguous", **knobs) == "block"
    for layout in ("masked", "contiguous"):
        assert grouped_config(layout, epilogue, **V3).row_frame and weight_frame(layout, **V3) == "row"
        split = grouped_config(layout, epilogue, **SPLIT)
        assert split.split_wg and not split.row_frame and not split.fast_silu and not split.swap_ab


@pytest.mark.parametrize("impl,layout,frame", [("cutedsl", "contiguous", "row"), ("cutedsl", "masked", "row"),
                                               ("cutedsl:v5", "masked", "block"), ("cutedsl:v2", "contiguous", "block"),
                                               ("cutedsl:v3", "masked", "row"),
                                               ("cutedsl:split-wg", "contiguous", "block")])
def test_the_family_impls_compile_the_frame_their_gemms_read(impl, layout, frame, monkeypatch):
    """The CompiledLayer the family impl compiles (what layer.run_layer and the model's adapter read to pick
    the weights) says the frame of its GEMMs' resolved config; recorded with the compiles faked."""
    from kernels.moe import layer
    seen = {}
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: None)
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **knobs: seen.setdefault(
        epilogue, layer.grouped_config(layout, epilogue, **knobs)))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: None)
    case = Case("moe", {**space.case("layer", "flash", 4096 if layout == "contiguous" else 8), "layout": layout})
    compiled = get_impl("moe", impl).compile(case, "sm_90a")
    rs = impl == "cutedsl" or impl == "cutedsl:v5"  # the rule (v8) and v5 read the RS-ordered code tiles
    assert compiled.frame == frame and compiled.row_frame == (frame == "row")
    assert compiled.codes == ("rs" if rs else "plain")
    assert {cfg.row_frame for cfg in seen.values()} == {frame == "row"} and len(seen) == 2


def test_layer_hands_v3_the_row_frame_weights(monkeypatch):
    """run_layer on a v3 compile passes the kernels the row-frame side data (one column scale per row), on a
    v2 compile the block frame's; recorded with fake kernels."""
    from kernels.moe import layer as L
    monkeypatch.setattr(L, "sm_count", lambda device: 132)
    e, d, i, t = 3, 512, 256, 11
    g = torch.Generator().manual_seed(4)
    ex = make_experts(e, d, i, g, "cpu")
    # two sub-blocks far apart in a row's K blocks: the frames' column scales differ
    ex.s1.view(torch.uint8)[:, :, 0] = 127 + 5
    ex.s2.view(torch.uint8)[:, :, 0] = 127 + 5
    experts = (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    x = torch.randn(t, d, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=g)[:3] for _ in range(t)]).int().repeat(1, 2)
    w = torch.rand(t, 6, generator=g)
    shared = torch.zeros(t, d, dtype=torch.bfloat16)
    for row_frame in (False, True):
        calls = {}

        def fake(name):
            return lambda *args: calls.setdefault(name, args)
        compiled = L.CompiledLayer({n: fake(n) for n in ("dispatch", "l1", "l2", "combine")}, row_frame=row_frame)
        L.run_layer(compiled, x, idx, w, shared, experts, e, None, check=False)
        want = (L.row_frame_weights if row_frame else L.layer_weights)(*experts)
        for name, wt in (("l1", want[0]), ("l2", want[1])):
            sw = calls[name][4]  # col_scale (N, KB, E)
            assert torch.equal(sw, wt.col_scale.permute(2, 1, 0))
            assert bool((sw == sw[:, :1]).all()) == row_frame
    # weights of the other frame are refused, not silently mis-scaled
    with pytest.raises(ValueError, match="frame"):
        L.run_prepared(compiled, x, idx, w, shared, *L.layer_weights(*experts), e, None, check=False)
    mixed = (L.row_frame_weights(*experts)[0], L.layer_weights(*experts)[1])
    for row_frame in (False, True):
        with pytest.raises(ValueError, match="frame"):
            L.run_prepared(L.CompiledLayer({}, row_frame=row_frame), x, idx, w, shared, *mixed, e, None, check=False)


def _loop_spills(compiled) -> int:
    """Spill loads / stores between the first and the last wgmma wait of the K-block loop (SASS)."""
    from dsv4bench.compile.sass import sass_of
    sass = sass_of(compiled)
    if sass is None:
        pytest.skip("no nvdisasm")
    lines = sass.splitlines()
    first = next(i for i, line in enumerate(lines) if "QGMMA" in line)
    last = max(i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR" in line)
    return sum(1 for line in lines[first:last] if re.search(r"\b(LDL|STL)\b", line))


def test_v3_epilogue_has_no_division_slow_path_and_stores_pairs():
    """fast_silu (v3's L1 epilogue): no call to the IEEE division's slow path, the e4m3 pairs of h as 2-byte
    stores (v2 / split-wg: 1-byte stores, the division's slow-path call)."""
    from dsv4bench.compile.sass import sass_of
    sass = {k: sass_of(compile_grouped("contiguous", "swiglu", 512, 256, **kn)) for k, kn in (("v3", V3), ("split", SPLIT))}
    if sass["v3"] is None:
        pytest.skip("no nvdisasm")
    assert "div_rn" not in sass["v3"] and "div_rn" in sass["split"]
    assert len(re.findall(r"STG\.E\.U16", sass["v3"])) > 0 and "STG.E.U8" not in sass["v3"]
    assert "STG.E.U8" in sass["split"]


@pytest.mark.parametrize("layout,epilogue,knobs", [("contiguous", "swiglu", V3), ("contiguous", "bf16", V3),
                                                   ("contiguous", "swiglu", SPLIT), ("contiguous", "bf16", SPLIT),
                                                   ("masked", "swiglu", V3), ("masked", "bf16", SPLIT),
                                                   ("contiguous", "swiglu", {**V7, "rs_codes": True}),
                                                   ("masked", "bf16", {**V3, "rs_codes": True})])
def test_v3_compiles_for_sm90a(layout, epilogue, knobs, monkeypatch):
    compiled = compile_checked(layout, epilogue, knobs, monkeypatch)
    if layout == "contiguous" and knobs.get("row_frame"):
        # v2's L1 refills 14 spilled values a K block (3 of them accumulators); v3's loop keeps at most a few
        # addresses there (the row-frame promotion holds no column scales across the wgmma)
        assert _loop_spills(compiled) <= 4


@pytest.mark.parametrize("layout,epilogue", [("masked", "swiglu"), ("masked", "bf16"), ("contiguous", "bf16")])
def test_v3_knockout_and_decode_compile_clean(layout, epilogue):
    """tests/wgmma_checks (no local memory, no serialised wgmma) on the v3 configurations that hold no spill:
    decode, and the prefill knock-out without the widening (`cutedsl:v3-ko-no-widen`)."""
    from tests.wgmma_checks import assert_compiles_clean
    knobs = V3 if layout == "masked" else {**V3, "ablate": "no-widen"}
    assert_compiles_clean(lambda kn: compile_grouped(layout, epilogue, 512, 256, **kn), knobs)


@pytest.mark.parametrize("epilogue", ["swiglu", "bf16"])
def test_v7_compiles_clean_is_the_prefill_pick_and_is_refused_elsewhere(epilogue, monkeypatch):
    """v7, v3 with an all-padding second wave skipped (GroupedConfig.skip_padding_wave): sm_90a, no serialised wgmma, the
    loop's spill refills as v3's; only v3 on the contiguous layout takes it; the family refuses it at decode."""
    knobs = V7
    assert _loop_spills(compile_checked("contiguous", epilogue, knobs, monkeypatch)) <= 4
    with pytest.raises(ValueError, match="skip_padding_wave"):
        GroupedConfig(layout="masked", bm=64, **knobs)
    impl = get_impl("moe", "cutedsl:v7")
    assert "contiguous" in impl.supports(Case("moe", space.case("layer", "flash", 8)))
    assert impl.supports(Case("moe", space.case("layer", "flash", 4096))) is None


@pytest.mark.parametrize("epilogue,n", [("swiglu", 1024), ("bf16", 512)])
def test_wide_split_compiles_the_fix_up_into_v3s_one_wave_tile_only(epilogue, n, monkeypatch):
    """v15's wide split: v3's masked 64-row tile with split_k (K 32 blocks, where the tail plan can pay)
    carries the fix-up's partial adds (REDG) and counter (ATOMG) and spills nothing; the plain wide pair has neither;
    split_k on v3's 128-row or contiguous tile is refused."""
    from dsv4bench.compile.sass import sass_of
    from kernels.moe.grouped_config import MAX_SPLIT, V8_PREFILL, V8_WIDE
    text = {k: sass_of(compile_checked("masked", epilogue, {**V8_WIDE, "pdl": True, "split_k": k}, monkeypatch, n, 4096))
            for k in (1, MAX_SPLIT)}
    if None in text.values():
        pytest.skip("no nvdisasm here")
    assert "REDG.E.ADD.F32" in text[MAX_SPLIT] and "ATOMG.E.ADD" in text[MAX_SPLIT]
    assert "REDG" not in text[1] and "ATOMG" not in text[1]
    for bad in ({**V8_WIDE, "bm": 128, "split_k": 2}, {**V8_PREFILL, "layout": "contiguous", "bm": 128, "split_k": 2}):
        with pytest.raises(ValueError, match="split_k"):
            GroupedConfig(**bad)


def test_wide_split_is_launched_where_each_expert_is_one_tile_and_the_tail_split_cuts(monkeypatch):
    """v15 (the rule) compiles the wide pair's split build beside it (`cutedsl:v14` does not); CompiledLayer.gemms
    launches it per GEMM where rows / mean_rows experts x n tiles leave a tail grouped_slices.tail_slices cuts on
    132 CTAs: capped Pro T = 64 sparse (6 experts: L1 144 units, L2 168), not Flash's 8 experts (128 units, one
    round), not past one 64-row tile an expert, not without mean_rows."""
    from kernels.moe import layer
    from kernels.moe.inputs import mean_rows
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: "dispatch")
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **knobs: (
        epilogue, *(lambda c: (c.bm, c.split_wg, c.split_k))(layer.grouped_config(layout, epilogue, **knobs))))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: "combine")
    assert "l1@wide-split" not in layer.compile_layer(16, 6, 7168, 3072, "masked",
                                                      **get_impl("moe", "cutedsl:v14").knobs).kernels
    for model, e, d, i, want in (("pro", 16, 7168, 3072, (8, 3)), ("flash", 64, 4096, 2048, (1, 1))):
        compiled = layer.compile_layer(e, 6, d, i, "masked")
        case = Case("moe", space.case("layer", model, 64, "sparse"))
        mean = mean_rows(case)
        assert mean == (64 if model == "pro" else 48)  # 6 / 8 experts hold all 384 assignments
        l1, l2, _ = compiled.gemms(64, mean, 64 * 6, 132)
        assert (l1[1:3], l2[1:3]) == ((64, True), (64, True))  # the wide pair (v3's 64-row tile)
        assert (l1[3], l2[3]) == ((8, 8) if want[0] > 1 else (1, 1))  # its split build (split_k 8) or the plain one
        assert compiled.gemms(64, mean, 64 * 6, None)[0][3] == compiled.gemms(64, None, 64 * 6, 132)[0][3] == 1
        assert compiled.gemms(80, mean, 64 * 6, 132)[0][3] == 1  # two tiles an expert: the unit count is a bound



def test_wide_early_gives_the_wide_pairs_l2s_early_weights(monkeypatch):
    """v16 (the rule): the wide pairs' L2s (v3, and v15's split build) compile with early_weights, their L1s and
    `cutedsl:v15`'s wide L2s without, v5's pairs the same in both; v3's L2 with it compiles clean (whole and split)."""
    from kernels.moe import layer
    from kernels.moe.grouped_config import MAX_SPLIT, V8_WIDE
    for k in (1, MAX_SPLIT):
        compile_checked("masked", "bf16", {**V8_WIDE, "pdl": True, "early_weights": True, "split_k": k}, monkeypatch,
                        512, 4096)
    with pytest.raises(ValueError, match="early_weights"):
        GroupedConfig(layout="masked", epilogue="swiglu", **V8_WIDE, pdl=True, early_weights=True)
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: "dispatch")
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **knobs: layer.grouped_config(
        layout, epilogue, **knobs))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: "combine")
    rule = layer.compile_layer(16, 6, 7168, 3072, "masked").kernels
    v15 = layer.compile_layer(16, 6, 7168, 3072, "masked", **get_impl("moe", "cutedsl:v15").knobs).kernels
    for pair in ("wide", "wide-split"):
        assert rule[f"l2@{pair}"].early_weights and not v15[f"l2@{pair}"].early_weights
        assert not rule[f"l1@{pair}"].early_weights
    assert {n: c for n, c in rule.items() if "wide" not in n} == {n: c for n, c in v15.items() if "wide" not in n}
    assert not layer.compile_layer(16, 6, 7168, 3072, "masked", l2_early=False).kernels["l2@wide"].early_weights


@pytest.mark.parametrize("epilogue", ["swiglu", "bf16"])
def test_v19_widener_covers_the_tile_once_and_the_consumers_loop_is_clean(epilogue, monkeypatch):
    """v19 (v7 with the widening by WIDENER_WARPS warps of the producer warpgroup, grouped_split._widen_rows; the
    rule's prefill pick v24 on v23's three B buffers): the widener threads' items cover each (row, sub-block) of the
    256-row tile once and store every 16-byte chunk of the widened tile once; the consumers' K loop holds no spill
    (v7's refills up to 4) and no widening (no PRMT after the first wgmma); v19 is refused off v7's configuration."""
    from kernels.moe.grouped_config import BN, V19, WIDENER_WARPS
    threads = 32 * WIDENER_WARPS
    dn, steps = threads // 4, -(-BN * 4 // threads)
    mine = [(t, s) for t in range(threads) for s in range(steps) if t // 4 + s * dn < BN]
    items = [(t // 4 + s * dn, t % 4) for t, s in mine]
    assert sorted(items) == [(n, j) for n in range(BN) for j in range(4)] and dn % 8 == 0
    chunks = [(t // 4) * 8 + s * dn * 8 + ((2 * (t % 4) + h) ^ (t // 4 % 8)) for t, s in mine for h in range(2)]
    assert sorted(chunks) == list(range(BN * 8))
    compiled = compile_checked("contiguous", epilogue, V19, monkeypatch, 1024, 1024)
    assert _loop_spills(compiled) == 0
    from dsv4bench.compile.sass import sass_of
    lines = sass_of(compiled).splitlines()
    first = next(i for i, line in enumerate(lines) if "QGMMA" in line)
    assert not any("PRMT" in line for line in lines[first:]) or epilogue == "swiglu"  # L1's epilogue packs h
    for layout, bm, bad in (("contiguous", 128, {**V19, "rs_codes": False}),
                            ("masked", 64, {**V19, "skip_padding_wave": False})):
        with pytest.raises(ValueError, match="widen_wg"):
            GroupedConfig(layout=layout, epilogue=epilogue, bm=bm, **bad)
    for regs in ({"producer_regs": 80, "consumer_regs": 216}, {"producer_regs": 72, "consumer_regs": 216,
                                                                "widen_wg": False}):
        with pytest.raises(ValueError, match="register split"):  # past the launch's 504 (80 / 216 / 216 hung)
            GroupedConfig(layout="contiguous", epilogue=epilogue, bm=128, **{**V19, **regs})
    # v23: three B buffers cost a stage (4 -> 3) and compile clean; v19's knob only. The rule's v24 is v23 with one
    # hand-over arrive a widener warp
    b3 = {**V19, "widen_buffers": 3}
    assert grouped_config("contiguous", epilogue) == GroupedConfig(layout="contiguous", epilogue=epilogue, bm=128,
                                                                   **{**b3, "warp_handover": True})
    assert GroupedConfig(layout="contiguous", epilogue=epilogue, bm=128, **b3).n_stages == 3
    assert _loop_spills(compile_checked("contiguous", epilogue, b3, monkeypatch, 1024, 1024)) == 0
    with pytest.raises(ValueError, match="widen_buffers"):
        GroupedConfig(layout="contiguous", epilogue=epilogue, bm=128, **{**b3, "widen_wg": False, "producer_regs": 40,
                                                                         "consumer_regs": 232})


def test_v24_wideners_hand_over_one_arrive_a_warp(monkeypatch):
    """v24, the prefill pick (v23 with GroupedConfig.warp_handover): the widened tiles' full barriers are initialised
    for one arrive a widener warp (WIDENER_WARPS, v23: 32 times it), given by lane 0 after a warp sync (PTX); no
    loop spill; refused off v19 / v23."""
    from kernels.moe.grouped_config import V23, V24, WIDENER_WARPS
    from dsv4bench.compile.artifacts import artifact
    for knobs, count in ((V24, WIDENER_WARPS), (V23, 32 * WIDENER_WARPS)):
        compiled = compile_checked("contiguous", "bf16", knobs, monkeypatch, 1024, 1024)
        ptx = artifact(compiled, "__ptx__")
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        regs = re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[[^\]]+\], (%r\d+);", ptx)
        movs = dict(re.findall(r"mov\.[ub]32\s+(%r\d+), (\d+);", ptx))
        counts = {int(movs[r]) for r in regs if r in movs}
        assert count in counts and (32 * WIDENER_WARPS in counts) == (knobs is V23)
        assert ("bar.warp.sync" in ptx) == (knobs is V24)
        assert _loop_spills(compiled) == 0
    with pytest.raises(ValueError, match="warp_handover"):
        GroupedConfig(layout="contiguous", epilogue="bf16", bm=128, **{**V7, "warp_handover": True})
