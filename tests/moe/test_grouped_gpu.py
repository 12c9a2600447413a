"""The grouped expert GEMM on a GPU (marked `gpu`: skipped without CUDA).

- each grouped GEMM against the torch model of its math (tests/moe/grouped_model.py) on our dispatch's
  layout: L1's h (codes dequantised with their scales) and L2's bf16 rows, on the real rows, small
  ragged shapes in both layouts, empty experts, one hot expert, a token on one expert twice;
- the whole layer (ours: dispatch -> L1 -> L2 -> combine) through the family's evaluation path
  (`gpu_check`: the tolerance rule against the low-precision reference), small drawn layers and the
  Flash shape at T = 1, 8, 64 (masked: v4) and 4096 (contiguous: v3, the tile rule's prefill pick);
- a masked count past max_m: ValueError from the layer op (with its check; none without it), and no host
  sync inside the layer op without the check.
"""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from kernels.moe.expert_weights import KBLOCK
from kernels.moe.glue import dispatch
from kernels.moe.inputs import make_experts
from kernels.moe.grouped_config import V2, V3, V4, V5, V7
from kernels.moe.layer import (compile_grouped, compile_layer, grouped_config, layer_weights,
                               row_frame_weights, run_grouped, run_layer, weight_frame)
from sweeps import moe as space
from tests.moe import grouped_model as model

pytestmark = pytest.mark.gpu

SMALL = [  # (E, D, I, T, load)
    (4, 256, 256, 19, "uniform"), (6, 384, 128, 70, "hash"), (12, 256, 384, 131, "sparse"),
    (8, 512, 256, 200, "hot"), (1, 256, 128, 7, "uniform"),
]


def _routing(e, t, load, gen):
    if load == "hot":  # every token on expert 0 first
        rest = torch.stack([torch.randperm(e - 1, generator=gen)[:5] + 1 for _ in range(t)])
        return torch.cat([torch.zeros(t, 1, dtype=torch.long), rest], 1)
    if load == "sparse":  # only the first 6 experts get tokens
        return torch.stack([torch.randperm(6, generator=gen) for _ in range(t)])
    if load == "hash":  # with replacement: a token may hit one expert twice
        return torch.randint(0, e, (t, 6), generator=gen)
    if e < 6:
        return torch.randint(0, e, (t, 6), generator=gen)
    return torch.stack([torch.randperm(e, generator=gen)[:6] for _ in range(t)])


def _problem(e, d, i, t, load, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ex = make_experts(e, d, i, torch.Generator("cuda").manual_seed(seed), "cuda")
    x = (torch.randn(t, d, generator=gen) * 2).bfloat16().cuda()
    idx = _routing(e, t, load, gen).int().cuda()
    w = (torch.rand(t, 6, generator=gen) + 0.1).cuda()
    return ex, x, idx, w


def _masked_max_m(idx, e):
    return -(-int(torch.bincount(idx.view(-1).long(), minlength=e).max()) // 16) * 16


KNOBS = {"rule": {}, "overlap": V2, "serial": {**V2, "overlap": False},
         "late-scales": {**V2, "early_scales": False}, "tiled-b": {**V2, "tiled_b": True},
         "split-wg": {**V2, "split_wg": True}, "v3": V3, "v4": V4, "v3-rs": {**V3, "rs_codes": True}}


@pytest.mark.parametrize("knobs", list(KNOBS.values()), ids=list(KNOBS))
@pytest.mark.parametrize("layout", ["masked", "contiguous"])
@pytest.mark.parametrize("shape", SMALL, ids=[f"E{s[0]}-D{s[1]}-I{s[2]}-T{s[3]}-{s[4]}" for s in SMALL])
def test_grouped_gemms_match_the_model(shape, layout, knobs):
    """The tile rule's pick (rule: v4 at decode, v3 at prefill), v4 at both layouts, v2 (overlap; serial), the
    v1 widening / promotion order, the tiled weight codes (tiled-b) and v3 (split-wg; v3 = split-wg on
    row-frame weights) against the model; each on the weights of its frame (layer.weight_frame). The
    shapes' counts put 1-16, 17-64 and over 64 rows on an expert (v4: one, several or every warp
    promotes; a tile past the first)."""
    ex, x, idx, w = _problem(*shape)
    _check_gemms(shape[0], shape[1], shape[2], ex, x, idx, w, layout, knobs)


def _check_gemms(e, d, i, ex, x, idx, w, layout, knobs, n_ctas=None):
    max_m = _masked_max_m(idx, e) if layout == "masked" else None
    lay = dispatch(x, idx, w, e, max_m)
    frame = weight_frame(layout, **knobs)
    l1w, l2w = (row_frame_weights if frame == "row" else layer_weights)(ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    rows = lay["src"].numel()
    group = lay["counts"] if max_m else lay["expert"]
    h = torch.zeros(rows, i, dtype=torch.uint8, device="cuda")
    hs = torch.zeros((i // KBLOCK, rows) if max_m is None else (e, i // KBLOCK, max_m), device="cuda")
    order = grouped_config(layout, "swiglu", **knobs).codes
    run_grouped(compile_grouped(layout, "swiglu", 2 * i, d, **knobs), lay["codes"], lay["scales"], l1w, group,
                lay["row_weight"], h, hs, max_m, True, order, n_ctas)
    y = torch.zeros(rows, d, dtype=torch.bfloat16, device="cuda")
    run_grouped(compile_grouped(layout, "bf16", d, i, **knobs), h, hs, l2w, group, lay["row_weight"], y, None, max_m,
                False, order, n_ctas)
    torch.cuda.synchronize()

    cpu = {k: v.cpu() for k, v in lay.items()}
    cpu_w = [type(l1w)(*(f.cpu() for f in (l.codes, l.shift, l.col_scale))) for l in (l1w, l2w)]
    real = cpu["src"] >= 0
    want_h, want_hs = model.layer1(cpu, cpu["codes"], cpu["scales"], cpu_w[0], max_m)
    got_hs = model.act_scales(hs.cpu(), max_m)
    deq = lambda c, s: c.view(torch.float8_e4m3fn).float().view(rows, -1, KBLOCK) * s[:, :, None]  # noqa: E731
    got, want = deq(h.cpu(), got_hs)[real], deq(want_h, want_hs)[real]
    assert torch.isfinite(got).all()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, f"L1 h: relative L2 {rel}"
    assert (got_hs[real] == want_hs[real]).float().mean() > 0.95  # scales: the same power of two, bar ties
    # L2 on the kernel's own h: its rows against the model's
    want_y = model.layer2(cpu, h.cpu(), got_hs, cpu_w[1])[real].float()
    got_y = y.cpu()[real].float()
    rel = ((got_y - want_y).norm() / want_y.norm()).item()
    assert rel < 5e-3, f"L2 rows: relative L2 {rel}"
    if max_m is not None:  # rows past each expert's count are never written
        assert (y.cpu()[~real] == 0).all() and (h.cpu()[~real] == 0).all()


@pytest.mark.parametrize("knobs", [V7, {**V7, "rs_codes": True}], ids=["v7", "v7-rs"])
@pytest.mark.parametrize("shape", SMALL, ids=[f"E{s[0]}-D{s[1]}-I{s[2]}-T{s[3]}-{s[4]}" for s in SMALL])
def test_v7_gemms_match_the_model(shape, knobs):
    """v7 (v3 with all-padding second waves skipped): segments of <= 64 rows (the wave skipped) and longer ones;
    on the plain codes and on v5's RS-ordered tiles (rs_codes)."""
    ex, x, idx, w = _problem(*shape)
    _check_gemms(shape[0], shape[1], shape[2], ex, x, idx, w, "contiguous", knobs)


@pytest.mark.parametrize("knobs", [V5, {**V5, "bm": 32}, {**V5, "pdl": True}, {**V5, "row_frame": True},
                                   {**V5, "bm": 32, "row_frame": True},
                                   {**V5, "bm": 32, "row_frame": True, "row_scale_once": True}],
                         ids=["v5", "v5-bm32", "v5-pdl", "v5-row", "v5-row-bm32", "v5-row-once-bm32"])
@pytest.mark.parametrize("shape", SMALL, ids=[f"E{s[0]}-D{s[1]}-I{s[2]}-T{s[3]}-{s[4]}" for s in SMALL])
def test_v5_masked_gemms_match_the_model(shape, knobs):
    """v5 (swap-AB, RS wgmma; masked only) at 16- and 32-token tiles: an expert's rows in one tile or several
    (counts 1-200: tiles past the first, a last tile part real), K of 1-4 blocks (odd counts: the unpaired
    last block), L2's N = 384 (the last 256-row tile half past N)."""
    ex, x, idx, w = _problem(*shape)
    _check_gemms(shape[0], shape[1], shape[2], ex, x, idx, w, "masked", knobs)


SPLIT = [((3, 4096, 512, 9, "hash"), 10), ((6, 4096, 2048, 1, "uniform"), 40), ((2, 2176, 2048, 40, "uniform"), 60)]


@pytest.mark.parametrize("bm", [16, 32])
@pytest.mark.parametrize("shape,n_ctas", SPLIT, ids=[f"E{s[0]}-D{s[1]}-I{s[2]}-T{s[3]}-{s[4]}-G{g}" for s, g in SPLIT])
def test_v5_tail_split_gemms_match_the_model(shape, n_ctas, bm):
    """v5 with its tail round split in K (split_k 8; kernels/moe/grouped_slices.py) on a grid shrunk to n_ctas CTAs,
    so that some units run whole in full rounds and the tail's run as 2-5 slices (L1's K of 32 / 17 blocks: uneven
    slices at D 2176; L2's K of 4-16 blocks mostly too short to split); a token twice on one expert (hash), several
    token tiles an expert (T = 40 on 2 experts). The workspace is left zeroed: the second call must agree too."""
    ex, x, idx, w = _problem(*shape)
    for _ in range(2):
        _check_gemms(shape[0], shape[1], shape[2], ex, x, idx, w, "masked",
                     {**V5, "row_frame": True, "bm": bm, "split_k": 8}, n_ctas)
    from kernels.moe.layer import _split_workspace
    work, count = _split_workspace(x.device)
    assert not work.any() and not count.any()


@pytest.mark.parametrize("knobs", [V2, KNOBS["split-wg"], KNOBS["v3"], V7, {**V7, "rs_codes": True}],
                         ids=["v2", "split-wg", "v3", "v7", "v7-rs"])
def test_prefill_gemms_at_4096_tokens_ragged_with_an_empty_expert(knobs):
    """Contiguous (prefill) GEMMs at T = 4096: 9 experts, skewed ragged counts (none a multiple of 128 but by
    chance), expert 8 never routed (0 tokens), K of 4 / 2 blocks; v2 and the v3 variants against the model."""
    e, d, i, t = 9, 512, 256, 4096
    gen = torch.Generator().manual_seed(11)
    ex = make_experts(e, d, i, torch.Generator("cuda").manual_seed(11), "cuda")
    x = (torch.randn(t, d, generator=gen) * 2).bfloat16().cuda()
    probs = torch.tensor([8.0, 5, 3, 2, 1.5, 1, 1, 0.7, 0.0])
    idx = torch.multinomial(probs.expand(t, e), 6, replacement=False, generator=gen).int().cuda()
    w = (torch.rand(t, 6, generator=gen) + 0.1).cuda()
    counts = torch.bincount(idx.view(-1).long(), minlength=e)
    assert counts[8] == 0 and (counts[:8] > 0).all()
    _check_gemms(e, d, i, ex, x, idx, w, "contiguous", knobs)


LAYER = [Case("moe", space.case("layer", "flash", t, load)) for t, load in
         ((1, "uniform"), (8, "uniform"), (64, "uniform"), (64, "hot"), (64, "sparse"), (64, "hash"),
          (4096, "uniform"), (4096, "hot"))]
LAYER += [Case("moe", space.case("layer", "pro", 1))]  # one token at Pro: the GEMV pick until session 34, v5 since
LAYER += [Case("moe", {**space.case("layer", "drawn", t, load, e, d, i), "layout": layout})
          for (e, d, i, t, load) in SMALL for layout in ("masked", "contiguous")]
# the masked work list's scan over warp 0's lanes (16 experts a lane): 384 experts (24 lanes, most groups empty at
# T = 8) and the full 512 (every lane; T = 64 spreads rows over most of them)
LAYER += [Case("moe", {**space.case("layer", "drawn", t, load, e, 256, 128), "layout": "masked"})
          for (e, t, load) in ((384, 8, "hot"), (512, 64, "uniform"))]


@pytest.mark.parametrize("case", LAYER, ids=[c.id for c in LAYER])
def test_layer_passes_the_rule(case, gpu_check):
    gpu_check(case)


VARIANT_CASES = [LAYER[0], LAYER[2], LAYER[6], LAYER[18]]  # Flash T = 1, 64 (masked), 4096; a drawn contiguous one


@pytest.mark.parametrize("variant", ["cutedsl:tiled-b", "cutedsl:pdl",
                                     "cutedsl:split-wg", "cutedsl:v3", "cutedsl:v2"])
@pytest.mark.parametrize("case", VARIANT_CASES, ids=[c.id for c in VARIANT_CASES])
def test_layer_variants_pass_the_rule(case, variant, gpu_check):
    """The A/B variants the sweep times next to `cutedsl` (docs/perf/moe.md v2; `cutedsl:v2`: v2 at prefill,
    where `cutedsl` is v3) are correct layers too."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", variant))


MASKED_CASES = [c for c in LAYER if c["layout"] == "masked"]


WIDE_SPLIT_CASES = [Case("moe", space.case("layer", m, t, load)) for m, t, load in
                    (("pro", 64, "sparse"), ("flash", 64, "sparse"), ("pro", 64, "uniform"), ("pro", 64, "hot"),
                     ("pro", 256, "uniform"))]


@pytest.mark.parametrize("case", WIDE_SPLIT_CASES, ids=[c.id for c in WIDE_SPLIT_CASES])
@pytest.mark.parametrize("impl", ["cutedsl", "cutedsl:v15"])
def test_wide_split_layers_pass_the_rule(case, impl, gpu_check):
    """v15 (the wide pair's tail split in K, in the rule): capped Pro T = 64 sparse is where it splits (L1 8 slices,
    L2 3: tests/moe/test_grouped_v3_cpu.py), the rest where it does not (Pro T = 256: the wide pair whole); the
    rule (v16: the wide pairs' L2s load their first weight stages before their PDL wait) and `cutedsl:v15` (not)."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", impl))


@pytest.mark.parametrize("case", MASKED_CASES, ids=[c.id for c in MASKED_CASES])
def test_fused_dispatch_layers_pass_the_rule(case, gpu_check):
    """`cutedsl:fused-dispatch` (the masked dispatch in one launch) on every decode layer."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", "cutedsl:fused-dispatch"))


@pytest.mark.parametrize("t, load", [(1, "uniform"), (5, "uniform"), (40, "hot")])
def test_v29_and_v27_agree_bit_for_bit_on_edge_routings(t, load):
    """v29 (the rule) changes where values are read, not what is computed: its layer equals v27's bits on fresh
    inputs with an id past E and a -1 (dropped), a token routed twice to one expert, experts with no tokens and (40,
    hot) an expert past max_m (its entries past it dropped alike)."""
    from dsv4bench.core.registry import get_impl
    e = 8
    ex, x, idx, w = _problem(e, 512, 256, t, load, seed=t)
    idx[0] = torch.tensor([1, 1, 9, -1, 2, 3], dtype=torch.int32)
    experts = (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    shared = torch.randn(x.shape, generator=torch.Generator().manual_seed(t)).bfloat16().cuda()
    outs = [run_layer(compile_layer(e, 6, 512, 256, "masked", **get_impl("moe", impl).knobs), x, idx, w, shared,
                      experts, e, 16, check=False) for impl in ("cutedsl:v27", "cutedsl")]
    assert torch.isfinite(outs[0].float()).all() and outs[0].abs().max() > 0
    assert torch.equal(outs[1], outs[0])


@pytest.mark.parametrize("case", MASKED_CASES, ids=[c.id for c in MASKED_CASES])
def test_v5_decode_layers_pass_the_rule(case, gpu_check):
    """v5 (swap-AB, masked only) on every decode layer: Flash T = 1 / 8 / 64 (uniform, hot, sparse, hash), the
    drawn ones."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", "cutedsl:v5"))


@pytest.mark.parametrize("case", MASKED_CASES, ids=[c.id for c in MASKED_CASES])
def test_rs_code_v3_decode_layers_pass_the_rule(case, gpu_check):
    """v3 on v5's RS-ordered code tiles (`cutedsl:v3-rs`, one 64-row wave a tile) on every decode layer."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", "cutedsl:v3-rs"))


V3_CASES = [LAYER[7], Case("moe", space.case("layer", "pro", 4096))]  # Flash T = 4096 hot, Pro T = 4096
V3_CASES += [c for c in LAYER[8:] if c["layout"] == "contiguous"]  # drawn prefill layers: ragged, empty experts
# ~56 rows an expert (some past 64): tiles whose second wave is all padding beside tiles that run it (v7's skip)
V3_CASES.append(Case("moe", space.case("layer", "flash", 600, e=64, d=512, i=256)))


@pytest.mark.parametrize("variant", ["cutedsl:split-wg", "cutedsl:v3", "cutedsl:v7", "cutedsl:v8-prefill", "cutedsl",
                                     "cutedsl:v19", "cutedsl:v23"])
@pytest.mark.parametrize("case", V3_CASES, ids=[c.id for c in V3_CASES])
def test_v3_prefill_layers_pass_the_rule(case, variant, gpu_check):
    """v3 (prefill) on the prefill layers beyond VARIANT_CASES: a hot expert, Pro's widths, the drawn ones; the rule's
    v24 (v7 widened by the producer warpgroup's warps into three B buffers, one hand-over arrive a warp), the picks
    before it (v19: two buffers; v23: an arrive a widener thread) on them too."""
    from dsv4bench.core.registry import get_impl
    gpu_check(case, get_impl("moe", variant))


def test_masked_count_past_max_m_raises():
    """The message a caller sees names max_m and the count it needs. (v1 used 4 experts, for which the hot
    routing draws only 4 ids a token: check_dispatch's shape error fired first.)"""
    e = 8
    ex, x, idx, w = _problem(e, 256, 128, 40, "hot")  # expert 0: 40 entries > max_m = 16
    assert idx.shape == (40, 6)
    compiled = compile_layer(e, 6, 256, 128, "masked")
    shared = torch.zeros_like(x)
    experts = (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    with pytest.raises(ValueError, match=r"max_m=16 is too small: an expert received 40 entries"):
        run_layer(compiled, x, idx, w, shared, experts, e, 16)
    out = run_layer(compiled, x, idx, w, shared, experts, e, 16, check=False)  # no read-back: no error
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


def test_masked_layer_without_the_check_never_syncs():
    """check=False (the family's timed path) makes no host sync inside the call (torch's sync debug mode
    turns one into an error); check=True does (the count read-back) and gives the same output."""
    e, t = 4, 19
    ex, x, idx, w = _problem(e, 256, 256, t, "uniform")
    max_m = _masked_max_m(idx, e)
    compiled = compile_layer(e, 6, 256, 256, "masked")
    experts = (ex.w1, ex.s1, ex.w3, ex.s3, ex.w2, ex.s2)
    shared = torch.zeros_like(x)
    want = run_layer(compiled, x, idx, w, shared, experts, e, max_m)  # warm: weights prepared, buffers cached
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = run_layer(compiled, x, idx, w, shared, experts, e, max_m, check=False)
        with pytest.raises(RuntimeError):
            run_layer(compiled, x, idx, w, shared, experts, e, max_m)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_layer_dispatch_leaves_masked_padding_rows_unwritten():
    """The layer's dispatch (skip_padding, v2): real rows and their scales equal the dispatch op's, padding
    rows keep what the buffer held (the GEMMs never store a padding row; a row's products are its own)."""
    from kernels.moe.glue import alloc_dispatch, compile_dispatch, run_dispatch
    e, d, t = 6, 384, 70
    _, x, idx, w = _problem(e, d, 128, t, "hash")
    max_m = _masked_max_m(idx, e)
    want = dispatch(x, idx, w, e, max_m)
    lay = alloc_dispatch(t, 6, e, d, max_m, "cuda")
    lay["codes"].fill_(0xAB)
    lay["scales"].fill_(-7.0)
    run_dispatch(compile_dispatch(e, 6, d, "masked", skip_padding=True), x, idx, w, lay, e, max_m)
    torch.cuda.synchronize()
    real = want["src"] >= 0
    assert (~real).any()
    for name in ("counts", "pos", "src", "expert", "row_weight"):
        assert torch.equal(lay[name], want[name]), name
    assert torch.equal(lay["codes"][real], want["codes"][real]) and (lay["codes"][~real] == 0xAB).all()
    got_s, want_s = (model.act_scales(v["scales"], max_m) for v in (lay, want))
    assert torch.equal(got_s[real], want_s[real]) and (got_s[~real] == -7.0).all()
