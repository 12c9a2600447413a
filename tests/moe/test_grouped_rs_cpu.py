"""v5 (kernels/moe/grouped_rs.py: swap-AB, the weights widened in registers as an RS wgmma's A) on the CPU: the
load-time RS byte order and the thread's widening give each fragment byte the widened code of its (row, k), with
the fragment layout the traced MMA declares; every configuration compiles for sm_90a with no local memory and no
serialised wgmma; the family refuses v5 at prefill."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from kernels.moe.expert_weights import (prepare, row_codes, rs_byte_order, rs_sign_layout, rs_tiles, widen_table,
                                        widened_codes)
from kernels.moe.grouped_config import BN, V4, V5, GroupedConfig
from kernels.moe.layer import rs_codes, weight_views
from sweeps import moe as space
from tests.moe import grouped_model as model
from tests.moe.compile_checks import compile_checked


def _fragment_coords(ctid: int, tile: int, word: int, byte: int) -> tuple[int, int]:
    """(weight row in the 256-row tile, k within the k step) of a fragment byte: PTX's m64 x k32 8-bit A layout,
    word rh + 2 kh (+ 4 s), byte v: row 16 warp + lane / 4 + 8 rh, k 4 (lane % 4) + v + 16 kh."""
    wg, warp, lane = ctid // 128, (ctid % 128) // 32, ctid % 32
    rh, kh = word % 2, word // 2
    return wg * 128 + tile * 64 + 16 * warp + lane // 4 + 8 * rh, 4 * (lane % 4) + byte + 16 * kh


def test_rs_sign_layout_widens_as_the_plain_word_does_and_is_undone():
    """widen8_rs on a word in the RS sign layout (expert_weights.rs_sign_layout) gives widen8's two words of the plain
    word, for every table and for words covering each nibble value in each position, all-sign / no-sign and random
    words; row_codes undoes the layout (the checkpoint's bytes back)."""
    rnd = random.Random(1)
    patterns = [0, 0xFFFFFFFF, 0x88888888, 0x77777777, 0x80000000, 0x00000008]
    patterns += [v << (4 * p) for v in range(16) for p in range(8)] + [rnd.getrandbits(32) for _ in range(1000)]
    as_bytes = torch.tensor([list(p.to_bytes(4, "little")) for p in patterns], dtype=torch.uint8)
    laid = rs_sign_layout(as_bytes).view(torch.int32).flatten().tolist()
    for t0, t1 in ([int(v) & 0xFFFFFFFF for v in pair] for pair in widen_table()):
        for plain, word in zip(patterns, laid):
            assert model.widen8_rs(word, t0, t1) == model.widen8(plain, t0, t1), (plain, word)
    codes = torch.randint(0, 256, (2, 300, 128), dtype=torch.int32).to(torch.uint8)
    w = prepare(codes, torch.full((2, 300, 8), 127, dtype=torch.uint8))
    assert torch.equal(row_codes(replace(w, codes=rs_tiles(codes), order="rs")), codes)


def test_rs_byte_order_is_a_permutation_of_each_k_block_row():
    order = rs_byte_order()
    assert sorted(order.tolist()) == list(range(64))
    assert order[:8].tolist() == [0, 1, 8, 9, 16, 17, 24, 25]  # quad 0: steps 0, 1 (bytes 2q, 2q + 1, 8 + 2q, ...)


@pytest.mark.parametrize("n", [256, 384])
def test_rs_fragments_hold_the_widened_codes(n):
    """Every consumer thread's fragments, built as the kernel builds them (one 16-byte read of its row in the
    RS-ordered tile, word s widened by `widen8_rs` with the table pair at the byte offset in byte s of the row's shift
    word), hold byte for byte the e4m3 codes of the v2 widening (expert_weights.widened_codes) at the (row, k) the
    fragment layout gives; K of 2 blocks, shifts spanning the table."""
    e, k = 1, 256
    g = torch.Generator().manual_seed(3)
    scales = torch.randint(118, 131, (e, n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    w = prepare(torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8), scales)
    want = widened_codes(w).view(torch.uint8)[0]  # [N, K]
    tiles = rs_codes(w)  # [E, NT, KB, BN, 64]
    b, _, _ = weight_views(w, "rs")
    assert b.shape == (BN, 64, tiles.shape[1] * tiles.shape[2]) and b.stride() == (64, 1, BN * 64)
    table = bytes(widen_table().view(torch.uint8).flatten().tolist())
    shift = w.shift[0]  # [KB, N, 4]
    for nt in range(tiles.shape[1]):
        for kb in range(k // 128):
            tile = tiles[0, nt, kb]
            for ctid in range(0, 256, 7):
                for j in range(2):
                    for rh in range(2):
                        row, _ = _fragment_coords(ctid, j, rh, 0)
                        if nt * BN + row >= n:
                            assert (tile[row] == 0).all()
                            continue
                        chunk = tile[row, 16 * (ctid % 4):16 * (ctid % 4) + 16].tolist()
                        shift_word = int.from_bytes(bytes(shift[kb, nt * BN + row].tolist()), "little")
                        for s in range(4):
                            word = int.from_bytes(bytes(chunk[4 * s:4 * s + 4]), "little")
                            t0, t1 = model.table_pair(table, model.pair_offset(shift_word, s))
                            for kh, out in enumerate(model.widen8_rs(word, t0, t1)):
                                for v in range(4):
                                    r, kk = _fragment_coords(ctid, j, rh + 2 * kh, v)
                                    assert (out >> (8 * v)) & 0xFF == int(want[nt * BN + r, 128 * kb + 32 * s + kk])


def test_rs_mma_declares_that_fragment_layout():
    """The traced RS MMA's A layout (thread, value) -> (m, k) is the one _fragment_coords assumes."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup
    from kernels.common import compile_kernel

    seen = []

    @cute.jit
    def probe(stream):
        fp8, kmaj = cutlass.Float8E4M3FN, warpgroup.OperandMajorMode.K
        mma = sm90_utils.make_trivial_tiled_mma(fp8, fp8, kmaj, kmaj, cutlass.Float32, (1, 1, 1), (64, 16),
                                                warpgroup.OperandSource.RMEM)
        seen.append(str(mma.tv_layout_A))

    try:
        compile_kernel(probe, arch="sm_90a")
    except Exception:  # noqa: BLE001 (a kernel-less function need not compile; the trace is what is checked)
        pass
    assert seen == ["((4,8,4),(4,2,2)):((256,1,16),(64,8,1024))"]  # index m + 64 k, see _fragment_coords


@pytest.mark.parametrize("row_frame", [False, True])
@pytest.mark.parametrize("epilogue,n,k,bm", [("swiglu", 512, 256, 16), ("bf16", 384, 384, 16),
                                             ("swiglu", 512, 384, 32), ("bf16", 512, 256, 32)])
def test_v5_compiles_for_sm90a(epilogue, n, k, bm, row_frame, monkeypatch):
    compile_checked("masked", epilogue, {**V5, "bm": bm, "row_frame": row_frame}, monkeypatch, n, k)


def test_row_frame_v5_promotes_without_the_weight_scale_products():
    """Row-frame v5 (the rule's decode pick since v8): a K block's promotion multiplies by x's scales alone. Between the loop
    body's two WARPGROUP.ARRIVE (one K block: its wgmmas, scales, the next block's widening, the promotion) the
    block frame has 32 FMUL at 32 tokens (2 tiles x 2 rows x 8 tokens of products), the row frame none, and
    ~8% fewer instructions (308 -> 284 at CuTeDSL 4.8.1 with widen8_rs; 341 -> 305 with widen8; 299 -> 261 with the
    shift bytes as table offsets). A word's table pair: its offset one `prmt`, no scaling of an index (no `& 0x7f8`)."""
    from dsv4bench.compile.sass import sass_of
    from kernels.moe.layer import compile_grouped

    body = {}
    for row_frame in (False, True):
        text = sass_of(compile_grouped("masked", "swiglu", 6144, 7168, **{**V5, "bm": 32, "row_frame": row_frame}))
        if text is None:
            pytest.skip("no nvdisasm here")
        ins = [line for line in text.splitlines() if "/*" in line and "*/" in line and ";" in line]
        arrive = [i for i, line in enumerate(ins) if "WARPGROUP.ARRIVE" in line]
        assert len(arrive) == 2  # the loop body: two K blocks, fragment sets alternating
        body[row_frame] = ins[arrive[0]:arrive[1]]
    assert sum(" FMUL " in line for line in body[False]) == 32
    assert sum(" FMUL " in line for line in body[True]) == 0
    assert len(body[True]) < 0.94 * len(body[False])
    # 16 words a K block, 3 prmt a word: 2 in widen8_rs, 1 for its table pair's byte offset (pair_offset)
    assert sum(" PRMT " in line for line in body[True]) == 48
    assert not any("0x7f8" in line for line in body[True])


@pytest.mark.parametrize("epilogue,bm", [("swiglu", 16), ("bf16", 32)])
def test_v5_split_k_compiles_and_only_it_carries_the_fix_up(epilogue, bm, monkeypatch):
    """split_k (kernels/moe/grouped_slices.py) at K of 32 blocks (a K too short for the tail plan to pay a fix-up,
    static, leaves no fix-up in the SASS): the compile has the fix-up's partial adds (REDG) and counter (ATOMG) and
    spills nothing; the rule's v5 (split_k 1) has neither; split_k on v2 / v4 is refused; the rule's wide pair (v3) is
    unsplit (its split build: v15, tests/moe/test_grouped_v3_cpu.py)."""
    from dsv4bench.compile.sass import sass_of
    from kernels.moe.grouped_config import MAX_SPLIT, V8_DECODE, V8_WIDE

    knobs = {**V8_DECODE, "bm": bm}
    text = {k: sass_of(compile_checked("masked", epilogue, {**knobs, "split_k": k}, monkeypatch, 512, 4096))
            for k in (1, MAX_SPLIT)}
    if None in text.values():
        pytest.skip("no nvdisasm here")
    assert "REDG.E.ADD.F32" in text[MAX_SPLIT] and "ATOMG.E.ADD" in text[MAX_SPLIT]
    assert "REDG" not in text[1] and "ATOMG" not in text[1]
    for bad in ({**V4, "split_k": 2}, {**V5, "bm": 16, "split_k": MAX_SPLIT + 1}):
        with pytest.raises(ValueError, match="split_k"):
            GroupedConfig(**bad)
    assert V8_WIDE["split_k"] == 1


def test_v8_knock_outs_drop_what_they_name_and_nothing_else():
    """`cutedsl:v8-ko-no-widen` / `-no-mma` / `v10-ko-stream` (timed, never compared): the loop body loses its table
    loads and widening PRMTs (no-widen), its QGMMAs (no-mma) or both (stream); the others keep them. no-mma and stream
    are refused off v5."""
    from dsv4bench.compile.sass import sass_of
    from kernels.moe.grouped_config import V8_DECODE
    from kernels.moe.layer import compile_grouped

    count = {}
    names = {"no-widen": "v8-ko-no-widen", "no-mma": "v8-ko-no-mma", "stream": "v10-ko-stream"}
    for ablate in ("", *names):
        impl = get_impl("moe", f"cutedsl:{names[ablate]}") if ablate else None
        assert impl is None or (not impl.checked and impl.knobs == {**V8_DECODE, "ablate": ablate})
        text = sass_of(compile_grouped("masked", "bf16", 512, 256, **{**V8_DECODE, "bm": 16, "ablate": ablate}))
        if text is None:
            pytest.skip("no nvdisasm here")
        count[ablate] = (text.count("QGMMA"), text.count(" PRMT "))
    assert count[""][0] == count["no-widen"][0] == 16 and count["no-mma"][0] == 0
    assert abs(count["no-mma"][1] - count[""][1]) <= 4 and count[""][1] > 4 * count["no-widen"][1]
    assert count["stream"][0] == 0 and count["stream"][1] == count["no-widen"][1]
    for ablate in ("no-mma", "stream"):
        with pytest.raises(ValueError, match=ablate):
            GroupedConfig(**{**V4, "ablate": ablate})


@pytest.mark.parametrize("counts", [[0, 5, 0, 0, 70, 1], [3], [0, 0, 129], [200, 0, 64, 65, 0], [0] * 511 + [2]])
def test_v5_work_list_covers_every_real_tile_once_m_tile_fastest(counts):
    """v5's unit order (GroupedRs._unit, modelled step for step): every (expert, m tile, n tile) holding rows
    once, no unit of an empty expert, and an expert's m tiles of one n tile on consecutive units."""
    mg, bm, tiles_n = 128, 16, 3
    units = model.work_units(counts, mg, bm, tiles_n, True, m_fastest=True)
    want = {(g, mt, nt, g) for g, c in enumerate(counts) for mt in range(-(-min(c, mg) // bm)) for nt in range(tiles_n)}
    assert len(units) == len(want) and set(units) == want
    for a, b in zip(units, units[1:]):
        if a[0] == b[0] and a[2] == b[2]:
            assert b[1] == a[1] + 1


def test_v5_config_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="masked-layout kernel"):
        GroupedConfig(**{**V5, "layout": "contiguous", "bm": 128})
    with pytest.raises(ValueError, match="bm"):
        GroupedConfig(**{**V5, "bm": 64})
    cfg = GroupedConfig(bm=16, **V5)
    assert cfg.n_stages >= 4 and cfg.a_boxes == 1 and cfg.tiled_codes


def test_family_runs_v5_at_decode_only():
    impl = get_impl("moe", "cutedsl:v5")
    assert impl.supports(Case("moe", space.case("layer", "flash", 8))) is None
    assert "masked layout only" in impl.supports(Case("moe", space.case("layer", "flash", 4096)))
    from kernels.moe.layer import SM90_ONLY, compile_grouped
    assert impl.supports(Case("moe", space.case("layer", "flash", 8)), "sm_100a") == SM90_ONLY  # wgmma: SM90 only
    with pytest.raises(ValueError, match="SM90"):
        compile_grouped("masked", "swiglu", 512, 256, arch="sm_100a", **V5)


def test_the_rule_compiles_a_gemm_pair_per_token_tile_and_a_call_takes_the_smallest_that_holds_it(monkeypatch):
    """compile_layer at decode (the rule, v8: v5 on row-frame weights with PDL) compiles L1 / L2 at 16 and 32 tokens
    a tile and the wide pair (v3 on the RS tiles), and the split builds of the 16-token tile (v11) and the wide pair
    (v15); CompiledLayer.gemms takes 16 for max_m <= 16, 32 up to 64, the
    wide pair past it; every pair reads the RS tiles. `cutedsl:v5` (block frame) keeps v4 (plain codes) as its
    wide pair; a variant naming bm, or v4, compiles one pair."""
    from kernels.moe import layer
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: ("dispatch", pdl))
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **knobs: (
        epilogue, *(lambda c: (c.bm, c.swap_ab, c.pdl, c.row_frame, c.codes))(layer.grouped_config(layout, epilogue,
                                                                                                  **knobs))))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: "combine")
    compiled = layer.compile_layer(8, 6, 512, 256, "masked")
    assert compiled.codes == "rs" and compiled.frame == "row" and compiled.token_tiles == (16, 32)
    assert set(compiled.kernels) == {"dispatch", "dispatch@fused", "l1", "l2", "l1@32", "l2@32", "l1@wide", "l2@wide",
                                     "l1@split", "l2@split", "l1@wide-split", "l2@wide-split", "combine"}
    assert compiled.kernels["dispatch"] == compiled.kernels["dispatch@fused"] == ("dispatch", True)
    for max_m, want in ((16, (16, True)), (32, (32, True)), (48, (32, True)), (64, (32, True)), (80, (64, False)),
                        (256, (64, False))):  # the wide pair launched with PDL as the rest of the layer
        l1, l2, order = compiled.gemms(max_m)
        assert (l1, l2) == (("swiglu", *want, True, True, "rs"), ("bf16", *want, True, True, "rs")) and order == "rs"
    # v3 where the experts holding rows average more than 32 (WIDE_MEAN), whatever max_m (not v4: cutedsl:v5 below)
    assert compiled.gemms(48, 48.0)[0][1:3] == (64, False) and compiled.gemms(48, 32.0)[0][1:3] == (32, True)
    block = layer.compile_layer(8, 6, 512, 256, "masked", **V5)  # cutedsl:v5: block frame, v4 past 64
    assert block.frame == "block" and block.token_tiles == (16, 32) and block.gemms(48, 48.0)[0][1:3] == (32, True)
    assert block.gemms(80) == (("swiglu", 64, False, True, False, "plain"), ("bf16", 64, False, True, False, "plain"),
                               "plain")
    one = layer.compile_layer(8, 6, 512, 256, "masked", **{**V5, "bm": 32})
    assert one.token_tiles == () and one.gemms(16) == (("swiglu", 32, True, True, False, "rs"),
                                                       ("bf16", 32, True, True, False, "rs"), "rs")
    v4 = layer.compile_layer(8, 6, 512, 256, "masked", **V4)
    assert v4.codes == "plain" and v4.gemms(16)[2] == "plain" and v4.gemms(16)[0][:3] == ("swiglu", 64, False)
    pre = layer.compile_layer(8, 6, 512, 256, "contiguous")  # prefill: v7 on the RS tiles, the same frame
    assert pre.codes == "rs" and pre.frame == "row" and pre.token_tiles == ()


@pytest.mark.parametrize("model,rows,want", [("pro", 6, (True, True)), ("pro", 12, (False, False)),
                                             ("flash", 6, (False, False)), ("pro", 3, (False, False))])
def test_the_rule_launches_the_tail_split_build_only_where_the_split_rule_cuts(monkeypatch, model, rows, want):
    """v11: compile_layer builds the 16-token tile a second time with split_k (the "split" pair); CompiledLayer.gemms
    takes it per GEMM where T x k units an n tile leave a tail grouped_slices.tail_slices cuts on 132 CTAs: Pro one
    token (L1 132 + 12 units: 8 slices; L2 132 + 36: 3), not two tokens (past one full round), not Flash (96 units:
    no CTAs to spare), not a tail too short in K; never without rows or at the 32-token tile; `cutedsl:v10` (tail_split
    False) and a variant with split_k of its own build no second pair."""
    from kernels.moe import layer
    from kernels.moe.grouped_slices import tail_slices
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: "dispatch")
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **knobs: (
        epilogue, *(lambda c: (c.bm, c.split_k))(layer.grouped_config(layout, epilogue, **knobs))))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: "combine")
    d, i = {"pro": (7168, 3072), "flash": (4096, 2048)}[model]
    compiled = layer.compile_layer(384, 6, d, i, "masked")
    l1, l2, order = compiled.gemms(16, None, rows, 132)
    assert (l1[2] > 1, l2[2] > 1) == want and l1[:2] == ("swiglu", 16) and l2[:2] == ("bf16", 16) and order == "rs"
    assert compiled.gemms(16)[0][2] == 1 and compiled.gemms(32, None, rows, 132)[0][1:] == (32, 1)
    assert tail_slices(144, 132, 56, 8) == 8 and tail_slices(168, 132, 24, 8) == 3 and tail_slices(96, 132, 32, 8) == 1
    assert tail_slices(144, 132, 9, 8) == 1 and tail_slices(264, 132, 56, 8) == 1
    for knobs in ({"tail_split": False}, {"split_k": 8}):
        assert not any(n.endswith("@split") for n in layer.compile_layer(384, 6, d, i, "masked", **knobs).kernels)
    assert get_impl("moe", "cutedsl:v10").knobs == {"tail_split": False, "l2_early": False, "fused_dispatch": 0}


def test_early_weights_load_their_first_weight_stages_before_the_pdl_wait(monkeypatch):
    """v13: the rule's v5 L2s (not its L1s) get early_weights, since v16 the wide pairs' L2s too (v3; `cutedsl:v5`'s
    wide pair, v4, not), `cutedsl:v12` none;
    in SASS the TMA warp's three weight loads come before a second griddepcontrol.wait (ACQBULK; the plain build has
    one); refused off an L2 of v5 or v3 under PDL (an L1 too: early L1 weights were set aside, `git show 0ca828c`)."""
    import re

    from dsv4bench.compile.sass import sass_of
    from kernels.moe import layer
    from kernels.moe.grouped_config import V8_DECODE, V8_WIDE
    knobs = {**V8_DECODE, "bm": 16, "pdl": True}
    ops = {}
    for early in (False, True):
        text = sass_of(layer.compile_grouped("masked", "bf16", 512, 1024, **knobs, early_weights=early))
        if text is None:
            pytest.skip("no nvdisasm here")
        ops[early] = re.findall(r"\b(ACQBULK|UTMALDG)\b", text)
    assert ops[False].count("ACQBULK") == 1 and ops[True].count("ACQBULK") == 2
    assert ops[True][ops[True].index("ACQBULK") + 1:].index("ACQBULK") == 3  # codes, shifts, column scales
    v2 = {**V8_WIDE, "split_wg": False, "row_frame": False, "fast_silu": False, "rs_codes": False, "pdl": True}
    for bad in ({**knobs, "epilogue": "swiglu"}, {**knobs, "pdl": False}, {**V8_WIDE, "pdl": False}, v2):
        with pytest.raises(ValueError, match="early_weights"):
            GroupedConfig(**{"layout": "masked", "epilogue": "bf16", **bad}, early_weights=True)
    monkeypatch.setattr(layer, "compile_dispatch", lambda *a, skip_padding, pdl, fused=False, **k: "dispatch")
    monkeypatch.setattr(layer, "compile_grouped", lambda layout, epilogue, *a, **k: (epilogue, k.get("early_weights")))
    monkeypatch.setattr(layer, "compile_combine", lambda *a, **k: "combine")
    early = {}
    for impl in ("cutedsl", "cutedsl:v12", "cutedsl:v5-no-pdl", "cutedsl:v5"):
        kernels = layer.compile_layer(8, 6, 512, 256, "masked", **get_impl("moe", impl).knobs).kernels
        early[impl] = {n for n, v in kernels.items() if isinstance(v, tuple) and v[1]}
    assert early == {"cutedsl": {"l2", "l2@32", "l2@split", "l2@wide", "l2@wide-split"}, "cutedsl:v12": set(),
                     "cutedsl:v5-no-pdl": set(), "cutedsl:v5": {"l2", "l2@32", "l2@split"}}  # v5's wide pair: v4



def test_the_rule_runs_one_token_on_the_grouped_gemms():
    """Since session 34 the rule has no one-token GEMV path (v5 on the sign-laid RS tiles beat it at Pro T = 1: 118.2
    against 126.4 us, H200, one process): a one-token Pro layer compiles the grouped pairs as at any decode count, the
    GEMV path stays a declared variant."""
    from kernels.moe.layer import CompiledLayer
    rule = get_impl("moe", "cutedsl")
    pro1 = Case("moe", space.case("layer", "pro", 1))
    assert rule.compile_key(pro1, "sm_90a") == rule.compile_key(Case("moe", space.case("layer", "pro", 8)), "sm_90a")
    compiled = rule.compile(pro1, "sm_90a")
    assert isinstance(compiled, CompiledLayer) and compiled.token_tiles == (16, 32)
    assert get_impl("moe", "cutedsl:gemv").supports(pro1, "sm_90a") is None


@pytest.mark.parametrize("epilogue,n,k", [("swiglu", 4096, 4096), ("bf16", 4096, 2048)])
def test_phase_stamps_read_the_clock_once_a_stamp_and_leave_the_k_loop_alone(epilogue, n, k):
    """GroupedConfig.stamps (benchmarks/moe_phases.py): one globaltimer read a stamp, none in the rule's build; the
    loop body between the two WARPGROUP.ARRIVE (two K blocks) holds the rule's instructions (the same opcodes as many
    times but for register moves; registers and order may differ), so the stamped phases time its loop.
    Stamps with a split are refused (they share its workspace)."""
    import collections
    import re

    from dsv4bench.compile.sass import sass_of
    from kernels.moe.grouped_config import STAMPS, V8_DECODE
    from kernels.moe.layer import compile_grouped

    knobs = {**V8_DECODE, "bm": 16, "pdl": True, "early_weights": epilogue == "bf16"}
    text = {st: sass_of(compile_grouped("masked", epilogue, n, k, **{**knobs, "stamps": st})) for st in (False, True)}
    if None in text.values():
        pytest.skip("no nvdisasm here")
    assert text[False].count("GLOBALTIMER") == 0
    assert text[True].count("GLOBALTIMER") == len(STAMPS)

    def loop(sass):
        ins = [re.sub(r"/\*[0-9a-f]{4}\*/", "", line).split() for line in sass.splitlines()
               if "/*" in line and ";" in line]
        ops = [words[1] if words[0].startswith("@") else words[0] for words in ins]  # past a predicate
        arrive = [i for i, op in enumerate(ops) if op == "WARPGROUP.ARRIVE"]
        return collections.Counter(ops[arrive[0]:arrive[1]])

    moves = ("MOV", "UMOV")
    stamped, rule = loop(text[True]), loop(text[False])
    assert {op: n for op, n in stamped.items() if op not in moves} == \
        {op: n for op, n in rule.items() if op not in moves}
    with pytest.raises(ValueError, match="stamps"):
        GroupedConfig(layout="masked", epilogue=epilogue, **{**knobs, "stamps": True, "split_k": 2})


@pytest.mark.parametrize("stamps", [False, True])
def test_a_stamped_layer_hands_its_gemms_the_stamp_workspace_and_the_rule_the_split_one(stamps, monkeypatch):
    """A stamped build (CompiledLayer.stamps, the variant `cutedsl:stamps`) writes where the split workspace goes: run
    with it, L1 and L2 get layer.stamp_workspace, so the rule's split builds never find stamps in theirs; recorded with
    fake kernels on the CPU. The variant compiles no tail-split pair (its GEMMs would need the split workspace)."""
    import torch

    from dsv4bench.core.registry import get_impl
    from kernels.moe import layer as L
    from kernels.moe.inputs import make_experts

    monkeypatch.setattr(L, "sm_count", lambda device: 132)
    e, d, i, t = 4, 256, 256, 3
    g = torch.Generator().manual_seed(5)
    ex = make_experts(e, d, i, g, "cpu")
    calls = {}

    def fake(name):
        return lambda *args: calls.setdefault(name, args)
    compiled = L.CompiledLayer({n: fake(n) for n in ("dispatch", "l1", "l2", "combine")}, stamps=stamps)
    idx = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)]).int()
    L.run_layer(compiled, torch.randn(t, d, generator=g).bfloat16(), idx, torch.rand(t, 2, generator=g),
                torch.zeros(t, d, dtype=torch.bfloat16), (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2), e, 8, check=False)
    want = (L.stamp_workspace if stamps else L._split_workspace)(torch.device("cpu"))
    for gemm in ("l1", "l2"):
        work, count = calls[gemm][-3:-1]
        assert (work.data_ptr(), count.data_ptr()) == (want[0].data_ptr(), want[1].data_ptr())
    assert get_impl("moe", "cutedsl:stamps").knobs == {"stamps": True, "tail_split": False}


def test_v27_reads_the_row_frames_column_scales_from_k_block_0_and_only_there():
    """v27 (GroupedConfig.row_scale_once; the decode rule, `cutedsl:v16` without): the row frame's column scales come
    from K block 0 at every stage, so the build differs from v16's while every stage still copies them; the block
    frame (whose scales differ a block) refuses it; prefill keeps v24's reads."""
    from dsv4bench.compile.sass import sass_of
    from dsv4bench.core.registry import get_impl
    from kernels.moe.grouped_config import V8_DECODE, choose
    from kernels.moe.layer import compile_grouped

    knobs = {**V8_DECODE, "bm": 16, "pdl": True}
    text = {once: sass_of(compile_grouped("masked", "swiglu", 4096, 4096, **{**knobs, "row_scale_once": once}))
            for once in (False, True)}
    if None in text.values():
        pytest.skip("no nvdisasm here")

    def count(sass, op):
        return sum(f" {op} " in line or f" {op}." in line for line in sass.splitlines())
    assert count(text[True], "UTMALDG") == count(text[False], "UTMALDG")  # every stage still copies them
    assert text[True] != text[False]
    with pytest.raises(ValueError, match="row frame"):
        GroupedConfig(**{**V5, "bm": 16, "row_scale_once": True})
    assert get_impl("moe", "cutedsl:v16").knobs == {"row_scale_once": False, "early_reads": False}  # before v27
    assert choose("masked", "swiglu").row_scale_once and not choose("contiguous", "swiglu").row_scale_once


@pytest.mark.parametrize("bm", [16, 32])
def test_v29_l1_reads_the_route_weights_before_its_k_loop(bm):
    """v29 (GroupedConfig.route_first, the rule's L1s since session 49): v5's L1 loads its tile's route weights (a
    thread's bm / 4 token columns) before the unit's first wgmma, so no global load is left after it (v27's epilogue
    makes those bm / 4 there); nothing spills; L2 and v3 refuse the mode."""
    import re

    from dsv4bench.compile.sass import sass_of
    from kernels.moe.grouped_config import V8_WIDE, V27_DECODE
    from kernels.moe.layer import compile_grouped

    after = {}
    for first in (False, True):
        text = sass_of(compile_grouped("masked", "swiglu", 4096, 4096, bm=bm, pdl=True, route_first=first))
        if text is None:
            pytest.skip("no nvdisasm here")
        lines = [line for line in text.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
        mma = next(i for i, line in enumerate(lines) if "GMMA" in line)
        after[first] = sum("LDG" in line for line in lines[mma:])
        assert "STL" not in text
    assert after == {False: bm // 4, True: 0}
    for knobs in ({**V27_DECODE, "bm": 16, "epilogue": "bf16"}, {**V8_WIDE, "bm": 64}):
        with pytest.raises(ValueError, match="route_first"):
            GroupedConfig(layout="masked", **knobs, route_first=True)

