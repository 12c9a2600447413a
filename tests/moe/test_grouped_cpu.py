"""The grouped expert GEMM on the CPU: the MXFP4 -> e4m3 widening (exact within 14 binades, bounded
beyond, refused on NaN scales), the kernel's bit-level widening (`prmt`) on every 4-code input, the
load-time layouts (interleave, shift words, column scales), the kernel's math (tests/moe/grouped_model)
against the low-precision reference, and sm_90a compiles (no local memory at decode, no serialised
wgmma) with sm_100a refused."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from kernels.moe.expert_weights import (EXACT_SPAN, PAIR_BYTES, SHIFT_BIAS, SHIFTS, flush_stats, interleave,
                                        prepare, prepare_layer, widen_table, widened_dequant)
from kernels.moe.grouped_config import V2, V4
from kernels.moe.inputs import make_experts
from kernels.moe.layer import SM90_ONLY, act_views, compile_grouped, weight_views
from oracles.moe import dispatch_layout, gather_quant, routed_lowprec
from oracles.quant import E2M1_GRID, mxfp4_dequant, unpack_fp4
from sweeps import moe as space
from tests.moe import grouped_model as model
from tests.moe.compile_checks import compile_checked


def _weight(e, n, k, exps, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    return codes, exps.to(torch.uint8)


def _exact(codes, exps):
    return mxfp4_dequant(unpack_fp4(codes), exps)


@pytest.mark.parametrize("span", [1, 3, 8, EXACT_SPAN + 1])
def test_widening_is_exact_within_14_binades(span):
    g = torch.Generator().manual_seed(span)
    exps = 120 + torch.randint(0, span, (3, 32, 512 // 32), generator=g)
    codes, exps = _weight(3, 32, 512, exps)
    assert flush_stats(exps)[0] == 0
    assert torch.equal(widened_dequant(prepare(codes, exps)), _exact(codes, exps))


def test_adversarial_spans_and_extreme_exponents():
    """Per (row, 128-K block): spans of exactly 14 (exact) and 15 / 40 (bounded), exponents 1 and 250 (the
    block factor 2^(m - 6 - 127) is then an fp32 subnormal / 2^117). Byte 0 is left out: the oracle decodes
    it as 0 (the bit trick), the kernel as 2^-127, a difference below 1e-37."""
    rows = [[100, 86, 86, 100], [250, 236, 250, 250], [1, 1, 1, 1], [15, 1, 8, 3],  # exact
            [100, 85, 100, 100], [200, 160, 199, 200]]  # one sub-block 15 / 40 binades down
    exps = torch.tensor(rows).view(1, len(rows), 4)
    codes, exps = _weight(1, len(rows), 128, exps, seed=3)
    w = prepare(codes, exps)
    diff = (widened_dequant(w) - _exact(codes, exps)).abs()
    assert diff[:, :4].max() == 0
    assert flush_stats(exps) == (2, len(rows) * 4)
    # beyond the bound: within half an e4m3 subnormal step of the block factor, and some values do move
    bound = (w.col_scale.transpose(1, 2).repeat_interleave(128, -1) * 2.0**-10)[:, 4:]
    assert (diff[:, 4:] <= bound).all() and diff[:, 4:].max() > 0


def test_nan_scales_are_refused():
    exps = torch.full((1, 2, 4), 127)
    exps[0, 1, 2] = 255
    with pytest.raises(ValueError, match="NaN"):
        prepare(*_weight(1, 2, 128, exps))


def test_kernel_bit_widening_matches_the_table_on_every_input():
    """The 4-code widening (model.widen4: prmt on the 3-bit magnitude, sign copied) for all 2^16 four-code inputs, a
    few shift tables, against the e4m3 encoding of grid · 2^shift with the sign."""
    table = widen_table().view(torch.uint8).view(SHIFTS, 8)
    words = widen_table()
    grid = torch.tensor(E2M1_GRID)
    for s in (0, 6, SHIFT_BIAS - 8, SHIFT_BIAS, SHIFT_BIAS + 6, SHIFTS - 1):
        t0, t1 = (int(v) & 0xFFFFFFFF for v in words[s])
        for x in range(0, 1 << 16, 97):  # a stride prime to 16: every nibble value in every position
            out = model.widen4(x, t0, t1)
            for k in range(4):
                nib = (x >> (4 * k)) & 0xF
                want = int(table[s, nib & 7]) | (0x80 if nib & 8 else 0)
                assert (out >> (8 * k)) & 0xFF == want, (s, x, k)
        vals = torch.tensor(list(table[s].numpy())).view(torch.float8_e4m3fn).float()
        assert torch.equal(vals, (grid * 2.0 ** (s - SHIFT_BIAS)).to(torch.float8_e4m3fn).float())


def test_v2_widening_of_8_codes_matches_v1_on_every_word_pattern():
    """grouped_widen.widen8 (v2: magnitudes by prmt on the low / high 16 selector bits, signs by prmt on
    (word, word << 4)) equals two v1 widen4 calls (codes 0-3, 4-7) on every table and on words covering
    every nibble value in every position, the all-sign / no-sign words and random words."""
    import random
    words = widen_table()
    rnd = random.Random(0)
    patterns = [0, 0xFFFFFFFF, 0x88888888, 0x77777777, 0x80000000, 0x00000008]
    patterns += [v * 0x11111111 for v in range(16)]
    patterns += [(v << (4 * p)) for v in range(16) for p in range(8)]
    patterns += [rnd.getrandbits(32) for _ in range(2000)]
    for s in range(SHIFTS):
        t0, t1 = (int(v) & 0xFFFFFFFF for v in words[s])
        for w in patterns:
            assert model.widen8(w, t0, t1) == (model.widen4(w & 0xFFFF, t0, t1), model.widen4(w >> 16, t0, t1)), (s, w)


def test_load_time_layouts():
    e, i, d = 2, 128, 256
    ex = make_experts(e, d, i, torch.Generator().manual_seed(1), "cpu")
    l1, l2 = prepare_layer(ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    assert l1.codes.shape == (e, 2 * i, d // 2) and l1.shift.shape == (e, d // 128, 2 * i, 4)
    assert l1.col_scale.shape == (e, d // 128, 2 * i) and l2.codes.shape == (e, d, i // 2)
    w13 = interleave(ex.w1, ex.w3)
    for row in range(2 * i):  # row 16q + x: gate 8q + x; row 16q + 8 + x: up 8q + x
        q, x = divmod(row, 16)
        src = ex.w1 if x < 8 else ex.w3
        assert torch.equal(w13[:, row], src[:, 8 * q + x % 8])
    # the kernel's epilogue: gate column col of a 256-wide tile nt is intermediate nt*128 + (col//16)*8 + col%8
    for col in [c for c in range(256) if c % 16 < 8]:
        assert (col // 16) * 8 + col % 8 == 8 * (col // 16) + col % 16
    # shift bytes: the byte offset of each sub-block's table pair, the max sub-block at shift 6
    assert bool((l1.shift % PAIR_BYTES == 0).all()) and int(l1.shift.max()) == PAIR_BYTES * (SHIFT_BIAS + 6)
    assert torch.equal(widened_dequant(l2), _exact(ex.w2.view(torch.uint8), ex.s2))


@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_kernel_math_matches_the_reference(layout):
    """L1 (bf16 gate/up, SwiGLU x route weight, FP8 h per 128) and L2 as the kernel computes them,
    summed per token, against oracles.moe.routed_lowprec: the same quantisation, so only accumulation
    order separates them."""
    e, d, i, t, k = 4, 256, 256, 19, 6
    g = torch.Generator().manual_seed(5)
    ex = make_experts(e, d, i, g, "cpu")
    x = (torch.randn(t, d, generator=g) * 2).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=g)[:4] for _ in range(t)]).int()
    idx = torch.cat([idx, idx[:, :2]], 1)  # a token twice on one expert (hash layers)
    w = torch.rand(t, k, generator=g)
    max_m = 48 if layout == "masked" else None
    rows = e * max_m if max_m else 19 * 6 + 127 * e
    lay = dispatch_layout(idx, w, e, rows, max_m)
    codes, scales = gather_quant(x, lay["src"], e if max_m else 1)
    l1, l2 = prepare_layer(ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    h, hs = model.layer1(lay, codes, scales, l1, max_m)
    y_rows = model.layer2(lay, h, hs, l2)
    pos = lay["pos"].long()
    got = y_rows.float()[pos].sum(1)
    ref = routed_lowprec(x, w, idx.long(), ex)
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, rel


@pytest.mark.parametrize("layout,epilogue,knobs", [("masked", "swiglu", V4), ("masked", "bf16", V4),
                                                   ("contiguous", "swiglu", V2), ("contiguous", "bf16", V2),
                                                   ("masked", "swiglu", {**V2, "overlap": False}),
                                                   ("masked", "bf16", {**V2, "ablate": "no-widen"}),
                                                   ("masked", "bf16", {**V2, "early_scales": False}),
                                                   ("masked", "swiglu", {**V2, "tiled_b": True}),
                                                   ("contiguous", "bf16", {**V2, "tiled_b": True}),
                                                   ("masked", "swiglu", {**V2, "pdl": True}),
                                                   ("masked", "swiglu", V2), ("masked", "bf16", V2),
                                                   ("contiguous", "swiglu", V4)])
def test_grouped_compiles_for_sm90a(layout, epilogue, knobs, monkeypatch):
    """v4 (v2 whose idle warps skip the promotion), v2 (V2: `cutedsl:v2`, at both layouts) and their A/B knobs;
    the rule's picks, v5 at decode and v3 at prefill, compile in test_grouped_rs_cpu.py / test_grouped_v3_cpu.py.
    v2's masked L2 (an A/B, not the rule) spills two words (the CTA index and the unit count, 8 B) in its 40-register
    producer since v10's warp-0 work-list scan (grouped_work.GroupedWorkList._work); nothing else spills."""
    known = 8 if (layout, epilogue, knobs) == ("masked", "bf16", V2) else 0
    compile_checked(layout, epilogue, knobs, monkeypatch, local_bytes=known)


def test_pdl_variant_waits_before_any_global_access():
    """cutedsl:pdl: every kernel launched after the first waits (griddepcontrol.wait) before touching global
    memory; the SASS of each dependent has its wait (ACQBULK) ahead of its first global load / TMA."""
    import re

    from dsv4bench.compile.sass import sass_of
    from kernels.moe.glue import compile_combine, compile_dispatch
    kernels = {"l1": compile_grouped("masked", "swiglu", 512, 256, pdl=True),
               "l2": compile_grouped("masked", "bf16", 256, 256, pdl=True),
               "dispatch": compile_dispatch(4, 6, 256, "masked", skip_padding=True, pdl=True),
               "combine": compile_combine(256, 6, pdl=True)}
    sass = {k: sass_of(v) for k, v in kernels.items()}
    if sass["l1"] is None:
        pytest.skip("no nvdisasm")
    for name, text in sass.items():
        bodies = re.split(r"\n\.text\.", text)[1:] or [text]
        if name == "dispatch":  # layout (not PDL-launched, triggers) and gather (waits)
            bodies = [b for b in bodies if "Gather" in b[:200]]
        for body in bodies:
            lines = body.splitlines()
            first_wait = next(i for i, l in enumerate(lines) if "ACQBULK" in l)
            first_global = next(i for i, l in enumerate(lines) if re.search(r"\b(LDG|STG|UTMALDG|LDGSTS)\b", l))
            assert first_wait < first_global, name


def test_v2_widening_uses_16_byte_shared_memory_vectors():
    """The SASS of the decode L1 kernel: v2 widens with 16-byte loads and stores (LDS.128 / STS.128)."""
    import re

    from dsv4bench.compile.sass import sass_of
    sass = sass_of(compile_grouped("masked", "swiglu", 512, 256, **V2))
    if sass is None:
        pytest.skip("no nvdisasm")
    assert len(re.findall(r"\bSTS\.128\b", sass)) >= 16 and not re.findall(r"\bSTS\.64\b", sass)


def test_layer_variants_are_declared():
    assert get_impl("moe", "cutedsl:serial").checked and not get_impl("moe", "cutedsl:ko-no-widen").checked
    case = Case("moe", space.case("dispatch", "flash", 8))
    assert get_impl("moe", "cutedsl:serial").supports(case, "sm_90a") is not None
    with pytest.raises(ValueError, match="ablate"):
        compile_grouped("masked", "swiglu", 512, 256, ablate="no-such")
    assert get_impl("moe", "cutedsl:tiled-b").knobs == {**V2, "tiled_b": True}
    assert get_impl("moe", "cutedsl:pdl").knobs == {**V2, "pdl": True}
    assert get_impl("moe", "cutedsl:serial").knobs == {**V2, "overlap": False}
    assert get_impl("moe", "cutedsl:ko-no-widen").knobs == {**V2, "ablate": "no-widen"}
    assert get_impl("moe", "cutedsl:v4").knobs == V4 and V4 == {**V2, "skip_idle_warps": True}
    assert not get_impl("moe", "cutedsl:v4-ko-no-widen").checked


def test_sm100a_is_unsupported_with_the_reason():
    case = Case("moe", space.case("layer", "flash", 8))
    assert get_impl("moe", "cutedsl").supports(case, "sm_100a") == SM90_ONLY
    assert get_impl("moe", "cutedsl").supports(case, "sm_90a") is None
    with pytest.raises(ValueError, match="SM90"):
        compile_grouped("masked", "swiglu", 512, 256, arch="sm_100a")


@pytest.mark.parametrize("max_m", [None, 32])
def test_kernel_views_have_the_compiled_strides(max_m):
    """The torch views run_grouped hands the kernel: the strides its fake tensors declare (kernels/moe/layer.py
    fake_grouped), every non-unit stride 16-byte aligned (TMA)."""
    e, d, i, rows = 3, 256, 128, (96 if max_m else 384)
    codes = torch.zeros(rows, d, dtype=torch.uint8)
    scales = torch.zeros((d // 128, rows) if max_m is None else (e, d // 128, max_m))
    a, sa = act_views(codes, scales, max_m)
    mg, g = (rows, 1) if max_m is None else (max_m, e)
    assert a.shape == (mg, d, g) and a.stride() == (d, 1, mg * d)
    assert sa.shape == (mg, d // 128, g) and sa.stride() == (1, mg, mg * d // 128)
    ex = make_experts(e, d, i, torch.Generator().manual_seed(0), "cpu")
    b, sh, sw = weight_views(prepare_layer(ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)[0])
    n, kb = 2 * i, d // 128
    assert b.shape == (n, d // 2, e) and b.stride() == (d // 2, 1, n * d // 2)
    assert sh.dtype == torch.int32 and sh.shape == (n, kb, e) and sh.stride() == (1, n, n * kb)
    assert sw.shape == (n, kb, e) and sw.stride() == (1, n, n * kb)


@pytest.mark.parametrize("max_m", [None, 32])
def test_layer_call_hands_the_kernels_what_the_v1_path_did(max_m, monkeypatch):
    """run_layer's planned call (buffers and views made once per shape, v2) passes each kernel arguments of
    the shapes, strides and dtypes the v1 path (run_dispatch / run_grouped / run_combine, fresh buffers)
    did, on the same buffers across calls; recorded with fake kernels on the CPU."""
    from kernels.moe import layer as L
    from kernels.moe.glue import alloc_dispatch, run_combine, run_dispatch
    monkeypatch.setattr(L, "sm_count", lambda device: 132)
    e, d, i, t = 4, 256, 256, 19
    g = torch.Generator().manual_seed(2)
    ex = make_experts(e, d, i, g, "cpu")
    experts = (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    x = torch.randn(t, d, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]).int()
    idx = torch.cat([idx, idx[:, :2]], 1)
    w = torch.rand(t, 6, generator=g)
    shared = torch.zeros(t, d, dtype=torch.bfloat16)
    calls = []

    def fake(name):
        return lambda *args: calls.append((name, args))
    compiled = L.CompiledLayer({n: fake(n) for n in ("dispatch", "l1", "l2", "combine")})
    for _ in range(2):
        L.run_layer(compiled, x, idx, w, shared, experts, e, max_m, check=False)
    new, again = calls[:4], calls[4:]
    calls.clear()
    l1w, l2w = L.layer_weights(*experts)
    lay = alloc_dispatch(t, 6, e, d, max_m, "cpu")
    run_dispatch(fake("dispatch"), x, idx, w, lay, e, max_m)
    rows = lay["src"].numel()
    group = lay["counts"] if max_m else lay["expert"]
    h = torch.empty(rows, i, dtype=torch.uint8)
    hs = torch.empty((i // 128, rows) if max_m is None else (e, i // 128, max_m))
    y_rows = torch.empty(rows, d, dtype=torch.bfloat16)
    L.run_grouped(fake("l1"), lay["codes"], lay["scales"], l1w, group, lay["row_weight"], h, hs, max_m, True)
    L.run_grouped(fake("l2"), h, hs, l2w, group, lay["row_weight"], y_rows, None, max_m, False)
    run_combine(fake("combine"), y_rows, lay["pos"], shared, torch.empty_like(shared))
    old = calls

    def desc(a):
        return (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
    for (n_new, a_new), (n_old, a_old), (_, a_again) in zip(new, old, again):
        assert n_new == n_old and len(a_new) == len(a_old), n_new
        for j, (p, q, r) in enumerate(zip(a_new, a_old, a_again)):
            if j == 0 and n_new == "dispatch" or isinstance(p, torch.Tensor) and p.data_ptr() == x.data_ptr():
                continue
            assert desc(p) == desc(q), (n_new, j)
            if isinstance(p, torch.Tensor) and (n_new, j) != ("combine", 3):  # y: a new output a call (y=None)
                # the same buffers (or the same weight / table) on the next call
                assert p.data_ptr() == r.data_ptr(), (n_new, j)


def test_a_call_launches_the_one_launch_dispatch_up_to_fused_max_assignments(monkeypatch):
    """v14: run_layer launches "dispatch@fused" where T·k <= CompiledLayer.fused_max, else "dispatch", with the
    same arguments; recorded with fake kernels on the CPU."""
    from kernels.moe import layer as L
    monkeypatch.setattr(L, "sm_count", lambda device: 132)
    e, d, i = 4, 256, 256
    g = torch.Generator().manual_seed(5)
    ex = make_experts(e, d, i, g, "cpu")
    calls = []
    names = ("dispatch", "dispatch@fused", "l1", "l2", "combine")
    compiled = L.CompiledLayer({n: (lambda n: lambda *a: calls.append((n, len(a))))(n) for n in names}, fused_max=12)
    for t in (1, 2, 3, 2):
        idx = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)]).int().repeat(1, 3)
        x, w, shared = torch.randn(t, d).bfloat16(), torch.rand(t, 6), torch.zeros(t, d, dtype=torch.bfloat16)
        L.run_layer(compiled, x, idx, w, shared, (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2), e, 16, check=False)
    launched = [(n, a) for n, a in calls if n.startswith("dispatch")]
    assert [n for n, _ in launched] == ["dispatch@fused", "dispatch@fused", "dispatch", "dispatch@fused"]
    assert len({a for _, a in launched}) == 1


@pytest.mark.parametrize("n", [512, 384])  # 384: the last 256-row tile half real (L2 with D % 256 == 128)
def test_tiled_codes_hold_each_fp4_tile_contiguously(n):
    """tiled_b's load-time layout: tile (e, n tile, K block) of the (BN, 64, tiles) view is the codes' rows
    [256 nt, 256 nt + 256) x bytes [64 kb, 64 kb + 64), zero rows past N; strides as fake_grouped declares."""
    from kernels.moe.grouped_config import BN
    from kernels.moe.layer import tiled_codes
    e, k = 3, 384
    g = torch.Generator().manual_seed(1)
    w = prepare(torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8),
                torch.full((e, n, k // 32), 127, dtype=torch.uint8))
    b, sh, _ = weight_views(w, "tiled")
    nt, kb = -(-n // BN), k // 128
    assert b.shape == (BN, 64, e * nt * kb) and b.stride() == (64, 1, BN * 64)
    assert sh.shape == (n, kb, e)
    for ee in range(e):
        for t in range(nt):
            for kk in range(kb):
                tile = b[:, :, (ee * nt + t) * kb + kk]
                real = min(BN, n - t * BN)
                assert torch.equal(tile[:real], w.codes[ee, t * BN:t * BN + real, 64 * kk:64 * kk + 64])
                assert (tile[real:] == 0).all()
    assert tiled_codes(w) is tiled_codes(w)  # made once per codes buffer


@pytest.mark.parametrize("counts", [[0, 5, 0, 0, 70, 1], [3], [0, 0, 129], [200, 0, 64, 65, 0], [0] * 511 + [2]])
def test_masked_work_list_covers_every_real_tile_once(counts):
    """The kernel's compact work list (prefix sum + binary search, modelled step for step): every m tile
    holding rows of an expert exactly once per n tile, no tile of an empty expert, counts past Mg cut."""
    mg, bm, tiles_n = 128, 64, 3
    units = model.work_units(counts, mg, bm, tiles_n, masked=True)
    want = [(g, mt, nt, g) for g, c in enumerate(counts) for mt in range(-(-min(c, mg) // bm)) for nt in range(tiles_n)]
    assert sorted(units) == sorted(want) and len(units) == len(set(units))


def test_contiguous_work_list_is_the_real_tile_prefix():
    idx = torch.tensor([[0, 2, 2, 5, 5, 1]] * 40 + [[2, 5, 5, 5, 5, 5]] * 30, dtype=torch.int32)
    lay = dispatch_layout(idx, torch.ones(idx.shape), 6, 1024)
    expert = lay["expert"].tolist()
    units = model.work_units(expert, 1024, 128, 2, masked=False)
    tiles = sorted({(mt, e) for _, mt, _, e in units})
    want = [(t, expert[t * 128]) for t in range(8) if expert[t * 128] >= 0]
    assert tiles == want and all(e >= 0 for e in expert[: len(want) * 128 : 128])
    assert all(x < 0 for x in expert[len(want) * 128:])  # the rest is padding: nothing left out


@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_compile_layer_consumes_skip_padding_for_either_layout(layout, monkeypatch):
    """`skip_padding` is the dispatch's knob: it must not reach the GEMM's config (the v1 variant's
    contiguous cases failed to compile with it on the H100)."""
    from kernels.moe import layer
    seen = {}
    monkeypatch.setattr(layer, "compile_dispatch",
                        lambda *a, skip_padding, pdl, fused=False, **k: seen.setdefault("skip", skip_padding))
    monkeypatch.setattr(layer, "compile_grouped", lambda *a, **knobs: seen.setdefault("knobs", knobs))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: None)
    layer.compile_layer(8, 2, 256, 256, layout, skip_padding=False)
    assert "skip_padding" not in seen["knobs"] and seen["skip"] is False
