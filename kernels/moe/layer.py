"""Glue of the grouped expert GEMM and the whole routed layer (ours): fake tensors and compiles, the
views the kernel takes of the dispatch buffers and the load-time weights, and the layer op

    dispatch (kernels/moe/dispatch.py) -> L1 (w1|w3 + SwiGLU x route weight -> FP8 h) -> L2 (w2 -> bf16
    rows) -> combine (kernels/moe/combine.py, + the shared expert's output)

The weights are prepared once per weight buffers (`layer_weights`: the interleaved L1 weight and the
side data of kernels/moe/expert_weights.py; `row_frame_weights` for the v3 GEMMs, the tile rule's prefill
pick), outside the timed call, as a model loading them would.
"""

from __future__ import annotations

from dataclasses import replace

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import Prepared, compile_kernel, sm_count
from kernels.gemm.tiling import KBLOCK
from kernels.moe.dispatch_fused import MAX_ASSIGNMENTS as FUSED_MAX
from kernels.moe.expert_weights import GroupedWeight, code_tiles, prepare_layer, rs_tiles, widen_table
from kernels.moe.glue import (
    check_dispatch, check_fits, compile_combine, compile_dispatch, dispatch_args, planned,
)
from kernels.moe.grouped_config import (BN, CODES, MAX_GROUPS, MAX_SPLIT, SPLIT_UNITS, STAMP_CTAS, STAMP_SLOTS, SWAP_BM,
                                        V4, V8_WIDE, WIDE_M, WIDE_MEAN, WIDEN_TABLE_WORDS, GroupedConfig, choose)
from kernels.moe.grouped_slices import tail_slices
from kernels.moe.grouped_sm90 import grouped_kernel

SM90_ONLY = "the grouped expert GEMM uses wgmma, which exists only on SM90 (sm_90a); no sm_100a kernel"


def _sym64(div: int = 1):
    return cute.sym_int64(divisibility=div)


def fake_grouped(layout: str, epilogue: str, n: int, k: int, tiled_b: bool = False) -> tuple:
    """Fake operands of one grouped GEMM: N weight rows, K reduction (compile-time); rows, groups and
    experts at run time (masked: G = E groups of Mg = max_m rows; contiguous: G = 1). tiled_b: the codes
    as (bn, 64, tiles) (`tiled_codes`, or v5's `rs_codes`)."""
    kb = k // KBLOCK
    mg = cute.sym_int32(divisibility=4)
    g = cute.sym_int32() if layout == "masked" else 1
    e = cute.sym_int32()
    rows, ng = cute.sym_int32(), cute.sym_int32()
    f32, u8, i32 = cutlass.Float32, cutlass.Uint8, cutlass.Int32
    a = make_fake_tensor(cutlass.Float8E4M3FN, (mg, k, g), (k, 1, _sym64(k)), assumed_align=16)
    sa = make_fake_tensor(f32, (mg, kb, g), (1, _sym64(4), _sym64(4)), assumed_align=16)
    if tiled_b:
        b = make_fake_tensor(u8, (BN, KBLOCK // 2, cute.sym_int32()), (KBLOCK // 2, 1, BN * KBLOCK // 2),
                             assumed_align=16)
    else:
        b = make_fake_tensor(u8, (n, k // 2, e), (k // 2, 1, n * k // 2), assumed_align=16)
    sh = make_fake_tensor(i32, (n, kb, e), (1, n, n * kb), assumed_align=16)
    sw = make_fake_tensor(f32, (n, kb, e), (1, n, n * kb), assumed_align=16)
    tab = make_fake_tensor(i32, (WIDEN_TABLE_WORDS,), (1,), assumed_align=16)
    group = make_fake_tensor(i32, (ng,), (1,), assumed_align=4)
    row_w = make_fake_tensor(f32, (rows,), (1,), assumed_align=4)
    if epilogue == "swiglu":
        out = make_fake_tensor(u8, (rows, n // 2), (n // 2, 1), assumed_align=16)
        mgs = cute.sym_int32()
        out_s = make_fake_tensor(f32, (mgs, n // BN, g), (1, _sym64(), _sym64()), assumed_align=4)
    else:
        out = make_fake_tensor(i32, (rows, n // 2), (n // 2, 1), assumed_align=16)
        out_s = make_fake_tensor(f32, (1, 1, 1), (1, 1, 1), assumed_align=4)
    work = make_fake_tensor(f32, (cute.sym_int32(),), (1,), assumed_align=16)
    count = make_fake_tensor(i32, (cute.sym_int32(),), (1,), assumed_align=4)
    return a, sa, b, sh, sw, tab, group, row_w, out, out_s, work, count, cutlass.Int32(132)


def grouped_config(layout: str, epilogue: str, **knobs) -> GroupedConfig:
    """The tile rule's pick (grouped_config.choose: v5 at decode, v3 at prefill) with `knobs` overriding
    GroupedConfig fields (the declared variants': grouped_config.V2 / V3 / V4, overlap, ablate, ...). Knobs that
    turn v5 off at decode (swap_ab False: v2 / v3 / v4) start from v2's 64-row wave on block-frame weights, without
    PDL; knobs of the block frame (v5, v4, ...) drop v27's once-a-unit column scales, a mode of the row frame."""
    base = choose(layout, epilogue)
    if base.swap_ab and not knobs.get("swap_ab", True):
        base = replace(base, swap_ab=False, bm=64, pdl=False, row_frame=False, row_scale_once=False)
    if not knobs.get("row_frame", base.row_frame):
        base = replace(base, row_scale_once=False)
    return replace(base, **knobs)


def weight_frame(layout: str, **knobs) -> str:
    """The frame of the weights the layer's GEMMs read for a layout (+ GEMM knobs): "row" (v3, the tile
    rule's prefill pick: `row_frame_weights`) or "block" (v2: `layer_weights`)."""
    return "row" if grouped_config(layout, "swiglu", **knobs).row_frame else "block"


def compile_grouped(layout: str, epilogue: str, n: int, k: int, arch: str = "sm_90a", **knobs):
    """One grouped GEMM; `knobs` override GroupedConfig fields of the tile rule's pick (overlap, ablate;
    grouped_config.V2 for v2 at prefill)."""
    if arch != "sm_90a":
        raise ValueError(SM90_ONLY)
    if n % (BN if epilogue == "swiglu" else KBLOCK) or k % KBLOCK:
        raise ValueError(f"N={n} must be a multiple of {BN} (L1) or {KBLOCK} (L2) and K={k} of {KBLOCK}")
    cfg = grouped_config(layout, epilogue, **knobs)
    return compile_kernel(grouped_kernel(cfg), *fake_grouped(layout, epilogue, n, k, cfg.tiled_codes), arch=arch)


def gemm_names(tile=None) -> tuple[str, str]:
    """A GEMM pair's names in CompiledLayer.kernels: "l1" / "l2" (the one pair, or v5's smallest token tile), else
    "l1@<tile>" / "l2@<tile>" (v5's other tiles, "wide": its pair past WIDE_M)."""
    suffix = "" if tile in (None, SWAP_BM[0]) else f"@{tile}"
    return "l1" + suffix, "l2" + suffix


class CompiledLayer:
    """The four compiles of the layer (dispatch, l1, l2, combine): `kernels` is how the harness's
    compile cache and cubin report see them (dsv4bench/compile/artifacts.compiled_functions);
    `codes`: the order the GEMMs read the weight codes in (GroupedConfig.codes; `wide_codes`: the wide pair's);
    `row_frame`: the GEMMs (v3, v5 in the rule) read weights prepared in the row frame (`row_frame_weights`);
    `split_shapes`: (n tiles, K blocks) of L1 and L2 where the tail-split pair ("l1@split", "l2@split") is compiled;
    `fused_max`: T·k assignments up to which a call launches "dispatch@fused" (v14) instead of "dispatch";
    `stamps`: the GEMMs write phase stamps (GroupedConfig.stamps) into `stamp_workspace`, passed where the split
    workspace goes."""

    def __init__(self, kernels: dict, codes: str = "plain", row_frame: bool = False, token_tiles: tuple = (),
                 wide_codes: str = "plain", wide_mean: float | None = None, split_shapes: tuple = (),
                 fused_max: int = 0, stamps: bool = False):
        self.kernels, self.codes, self.row_frame, self.token_tiles = kernels, codes, row_frame, token_tiles
        self.wide_codes, self.wide_mean, self.split_shapes = wide_codes, wide_mean, split_shapes
        self.fused_max, self.stamps = fused_max, stamps

    def gemms(self, max_m: int | None, mean_rows: float | None = None, rows: int | None = None,
              n_sms: int | None = None) -> tuple:
        """(L1, L2, the codes order they read) for a call. The rule's decode pick (`token_tiles`: v5 at each tile,
        the wide pair beside them) takes the smallest v5 tile holding max_m (the largest count, known on the host),
        the wide pair past WIDE_M (more token tiles than v5 gains by: docs/perf/moe.md "v5") or, v8's (v3), where the
        experts holding rows average more than `wide_mean` (WIDE_MEAN; `mean_rows`, when the caller knows it: v4,
        block-frame v5's pair, lost there); otherwise the one pair. v11: at the smallest tile, a GEMM whose units
        (at most `rows` (tokens x k) an n tile) would leave a tail the split rule cuts (grouped_slices.tail_slices on
        `n_sms` CTAs) runs its tail-split build. v15: the same for the wide pair where each expert holding rows is one
        64-row tile (max_m <= WIDE_M) and the caller knows `mean_rows` (then rows / mean_rows experts, exactly)."""
        if not self.token_tiles or max_m is None:
            pair, codes = gemm_names(), self.codes
        elif max_m > WIDE_M or (None not in (mean_rows, self.wide_mean) and mean_rows > self.wide_mean):
            pair, codes = gemm_names("wide"), self.wide_codes
        else:
            pair, codes = gemm_names(next((b for b in self.token_tiles if b >= max_m), self.token_tiles[-1])), self.codes
        split = None  # (the split pair, a bound of its GEMMs' units an n tile)
        if self.split_shapes and pair == gemm_names() and None not in (rows, n_sms):
            split = gemm_names("split"), rows
        elif gemm_names("wide-split")[0] in self.kernels and pair == gemm_names("wide") and max_m <= WIDE_M and \
                None not in (rows, n_sms, mean_rows):  # one 64-row tile an expert: rows / mean_rows experts' units
            split = gemm_names("wide-split"), round(rows / mean_rows)
        if split is not None:
            names, units = split
            pair = tuple(names[j] if tail_slices(units * tiles_n, n_sms, n_kb, MAX_SPLIT) > 1 else pair[j]
                         for j, (tiles_n, n_kb) in enumerate(self.split_shapes))
        return self.kernels[pair[0]], self.kernels[pair[1]], codes

    @property
    def frame(self) -> str:
        """The frame of the weights the GEMMs read (expert_weights.prepare's): "row" (the rule: v3, v5, v7) or "block"
        (v2, v4, `cutedsl:v5`)."""
        return "row" if self.row_frame else "block"


def compile_layer(n_experts: int, topk: int, d: int, i: int, layout: str, arch: str = "sm_90a",
                  **knobs) -> CompiledLayer:
    """The layer's kernels for one (E, k, D, I, layout); `knobs` as compile_grouped's, plus tail_split (default True:
    the rule's smallest v5 tile also as a tail-split build, `cutedsl:v10` without it), l2_early (default True, v13:
    v5's L2s under PDL with GroupedConfig.early_weights; `cutedsl:v12` without), fused_dispatch (v14: the masked
    dispatch in one launch, kernels/moe/dispatch_fused.py, compiled beside the two-kernel one and launched up to
    this many T·k assignments; default its MAX_ASSIGNMENTS, 0 never: `cutedsl:v13`), wide_split (v15, default True:
    the wide pair's tail-split build beside it; `cutedsl:v14` without), wide_early (v16, default True:
    the wide pairs' L2s with early_weights too; `cutedsl:v15` without), early_reads (v29, default True; `cutedsl:v27`
    without: v5's L1s read the route weights at a unit's start, GroupedConfig.route_first; combine reads pos and the
    shared output before its PDL wait; the fused dispatch loads x before ranking its assignments) and skip_padding
    (default True): the masked layout's padding rows (E · max_m rows for a few real ones at decode) are not gathered (v2; v1
    wrote zeros: a Flash T = 1 step wrote 1024 rows x 4 KB for 6 real rows). The CompiledLayer's codes / row_frame
    are those of the GEMMs' resolved config (the tile rule's pick with the knobs): with no knobs every GEMM reads
    row-frame weights and the RS-ordered code tiles (v8)."""
    if arch != "sm_90a":
        raise ValueError(SM90_ONLY)
    knobs = dict(knobs)
    skip = knobs.pop("skip_padding", True) and layout == "masked"  # popped for either layout
    tail_split = knobs.pop("tail_split", True) and knobs.get("split_k", 1) == 1
    wide_split = knobs.pop("wide_split", True) and tail_split  # v15 (`cutedsl:v14` without)
    l2_early = knobs.pop("l2_early", True)  # v13: v5's L2s with early_weights
    wide_early = knobs.pop("wide_early", True) and l2_early  # v16: the wide pairs' L2s too (`cutedsl:v15` without)
    fused_max = knobs.pop("fused_dispatch", FUSED_MAX)  # v14's one-launch dispatch (popped for either layout)
    early_reads = knobs.pop("early_reads", True)  # v29 (`cutedsl:v27` without): reads ahead of the launch edges' waits
    if not skip:  # only the masked layer's dispatch has the one-launch form
        fused_max = 0
    cfg = grouped_config(layout, "swiglu", **knobs)
    pdl = cfg.pdl  # the GEMMs' (the rule's decode pick launches with PDL): dispatch's gather and combine follow
    tiles = SWAP_BM if cfg.swap_ab and "bm" not in knobs else ()  # v5 by the rule: a pair per token tile + the wide
    kernels = {"dispatch": compile_dispatch(n_experts, topk, d, layout, arch, skip_padding=skip, pdl=pdl)}
    if fused_max:
        kernels["dispatch@fused"] = compile_dispatch(n_experts, topk, d, layout, arch, skip_padding=True, pdl=pdl,
                                                     fused=True, early_x=early_reads)
    # the wide pair beside v5's tiles, on v5's weights: v3 on the RS tiles (row frame: the rule) or v4 (block frame)
    # the wide pair reads v27's column scales as the v5 pair does (grouped_config drops them where swap_ab goes off)
    wide = {**knobs, **(V8_WIDE if cfg.row_frame else V4), "pdl": pdl, "row_scale_once": cfg.row_scale_once}
    if wide.get("ablate") in ("no-mma", "stream"):  # v5's knock-outs only: the wide pair runs whole
        wide["ablate"] = ""
    pairs = [(bm, {**knobs, "bm": bm}) for bm in tiles] + ([("wide", wide)] if tiles else [])
    # v11: the smallest tile's tail-split build beside it (CompiledLayer.gemms launches it where the split rule cuts)
    split_shapes = ((-(-2 * i // BN), d // KBLOCK), (-(-d // BN), i // KBLOCK)) if tail_split and tiles else ()
    if split_shapes:
        pairs.append(("split", {**knobs, "bm": tiles[0], "split_k": MAX_SPLIT}))
        if wide_split and wide.get("split_wg"):  # v3's one-wave tile (v4, the block frame's wide pair, has no split)
            pairs.append(("wide-split", {**wide, "split_k": MAX_SPLIT}))
    for name, pair_knobs in pairs or [(None, knobs)]:
        n1, n2 = gemm_names(name)
        v5 = bool(tiles) and name not in ("wide", "wide-split")
        v5_pdl = v5 and pdl
        kernels[n1] = compile_grouped(layout, "swiglu", 2 * i, d, arch,
                                      **{**pair_knobs, **({"route_first": True} if early_reads and v5 else {})})
        # v16: the wide pairs' L2s too where they are v3 (the block frame's wide pair, v4, has no early pass)
        wide_l2 = name in ("wide", "wide-split") and pdl and pair_knobs.get("split_wg", False)
        early = (v5_pdl and l2_early) or (wide_early and wide_l2)
        kernels[n2] = compile_grouped(layout, "bf16", d, i, arch, **pair_knobs, early_weights=early)
    kernels["combine"] = compile_combine(d, topk, arch, pdl, early=early_reads and pdl)
    wide_codes = grouped_config(layout, "swiglu", **wide).codes if tiles else cfg.codes
    return CompiledLayer(kernels, cfg.codes, cfg.row_frame, tiles, wide_codes, WIDE_MEAN if cfg.row_frame else None,
                         split_shapes, fused_max, cfg.stamps)


# ---------------------------------------------------------------- views and calls

_WEIGHTS = Prepared()
_TABLES: dict = {}


def layer_weights(w1, s1, w3, s3, w2, s2) -> tuple[GroupedWeight, GroupedWeight]:
    """(L1, L2) grouped weights, made once per weight buffers (the interleave and the side data)."""
    return _WEIGHTS.get((w1, s1, w3, s3, w2, s2), lambda: prepare_layer(w1, s1, w3, s3, w2, s2))


_WEIGHTS_ROW = Prepared()


def row_frame_weights(w1, s1, w3, s3, w2, s2) -> tuple[GroupedWeight, GroupedWeight]:
    """layer_weights in the row frame (expert_weights.prepare(frame="row"): one column scale per weight row),
    what the v3 GEMMs with GroupedConfig.row_frame read; made once per weight buffers."""
    return _WEIGHTS_ROW.get((w1, s1, w3, s3, w2, s2), lambda: prepare_layer(w1, s1, w3, s3, w2, s2, frame="row"))


def _table(device) -> torch.Tensor:
    key = str(device)
    if key not in _TABLES:
        _TABLES[key] = widen_table(device).reshape(-1).contiguous()
    return _TABLES[key]


def _split_workspace(device) -> tuple[torch.Tensor, torch.Tensor]:
    """v5's split workspace (GroupedConfig.split_k; kernels/moe/grouped_slices.py), zeroed once and left zeroed by
    every call: fp32 partial tiles of SPLIT_UNITS x SMs units (bn x the widest token tile) and their counters. One
    per device, shared by every layer: the layer's GEMMs run one after another on the caller's stream."""
    key = ("split", str(device))
    if key not in _TABLES:
        cap = SPLIT_UNITS * sm_count(device)
        _TABLES[key] = (torch.zeros(cap * BN * max(SWAP_BM), dtype=torch.float32, device=device),
                        torch.zeros(cap, dtype=torch.int32, device=device))
    return _TABLES[key]


def stamp_workspace(device) -> tuple[torch.Tensor, torch.Tensor]:
    """A stamped build's (GroupedConfig.stamps) stand-in for the split workspace, which it has no split to use: L1's
    and L2's regions of STAMP_CTAS x STAMP_SLOTS int32 stamps (as fp32 words) and an unused counter; one per device,
    apart from the split workspace so the rule's split builds always find theirs zeroed."""
    key = ("stamps", str(device))
    if key not in _TABLES:
        _TABLES[key] = (torch.zeros(2 * STAMP_CTAS * STAMP_SLOTS, dtype=torch.float32, device=device),
                        torch.zeros(1, dtype=torch.int32, device=device))
    return _TABLES[key]


def _unused_scales(device) -> torch.Tensor:
    """L2's out_s argument (unused by the bf16 epilogue): one buffer per device, not a fill launch a call."""
    key = ("unused", str(device))
    if key not in _TABLES:
        _TABLES[key] = torch.zeros(1, 1, 1, dtype=torch.float32, device=device)
    return _TABLES[key]


_TILED = Prepared(size=2)


def tiled_codes(w: GroupedWeight) -> torch.Tensor:
    """The codes in load-time tiles, uint8 [E, NT, KB, BN, 64] (N padded with zero rows to NT · BN): the FP4
    tile of one (expert, n tile, K block) is 16 KB contiguous (GroupedConfig.tiled_b). Made once per codes
    buffer (the last two: L1 and L2)."""
    return _TILED.get((w.codes,), lambda: code_tiles(w.codes))


_RS = Prepared(size=2)


def rs_codes(w: GroupedWeight) -> torch.Tensor:
    """`tiled_codes` with each row's 64 bytes of a K block in the RS byte order (expert_weights.rs_tiles), what the
    rule's GEMMs (v8) read: an "rs" weight's own codes, else made once per codes buffer (the last two: L1 and L2)."""
    return w.codes if w.order == "rs" else _RS.get((w.codes,), lambda: rs_tiles(w.codes))


def weight_views(w: GroupedWeight, codes: str = "plain") -> tuple:
    """(codes (N, K/2, E) or, tiled / rs, (BN, 64, E·NT·KB), shift words int32 (N, KB, E), col_scale (N, KB, E)) as
    the kernel's TMA reads them. A weight holding only the RS tiles (order "rs") serves "rs" compiles only."""
    e, n, k = w.shape
    if codes not in CODES:
        raise ValueError(f"codes must be one of {CODES}, got {codes!r}")
    if w.order == "rs" and codes != "rs":
        raise ValueError(f"the weight holds v5's RS-ordered code tiles only; this compile reads {codes!r} codes")
    if codes == "plain":
        codes = w.codes.permute(1, 2, 0)
    else:
        codes = (rs_codes(w) if codes == "rs" else tiled_codes(w)).view(-1, BN, KBLOCK // 2).permute(1, 2, 0)
    return (codes, w.shift.view(torch.int32).view(e, k // KBLOCK, n).permute(2, 1, 0), w.col_scale.permute(2, 1, 0))


def act_views(codes: torch.Tensor, scales: torch.Tensor, max_m: int | None) -> tuple:
    """Dispatch-layout activations -> (codes e4m3 (Mg, K, G), scales (Mg, K/128, G))."""
    fp8 = codes.view(torch.float8_e4m3fn)
    if max_m is None:  # scales [K/128, rows]; one group whose stride is a whole tensor (TMA wants 16-byte strides)
        rows, k = fp8.shape
        kb = scales.shape[0]
        return fp8.as_strided((rows, k, 1), (k, 1, rows * k)), scales.as_strided((rows, kb, 1), (1, rows, rows * kb))
    e = scales.shape[0]  # scales [E, K/128, max_m]
    return fp8.view(e, max_m, -1).permute(1, 2, 0), scales.permute(2, 1, 0)


def run_grouped(compiled, codes, scales, w: GroupedWeight, group, row_w, out, out_s, max_m, swiglu: bool,
                order: str = "plain", n_ctas: int | None = None):
    """One grouped GEMM on dispatch-layout activations (codes, MN-major scales): swiglu (L1) writes h codes
    and scales into out / out_s (dispatch's layout), else bf16 rows into out. `order`: the codes the compile
    reads (GroupedConfig.codes of its config); `n_ctas`: the persistent grid (default: the SMs; tests shrink it to
    give a few units full rounds and a tail)."""
    if max_m is not None and group.numel() > MAX_GROUPS:
        raise ValueError(f"{group.numel()} experts: the masked kernel's work list holds at most {MAX_GROUPS}")
    a, sa = act_views(codes, scales, max_m)
    b, sh, sw = weight_views(w, order)
    if swiglu:
        o, os_ = out, act_views(out, out_s, max_m)[1]
    else:
        o, os_ = out.view(torch.int32), _unused_scales(out.device)
    compiled(a, sa, b, sh, sw, _table(codes.device), group, row_w, o, os_, *_split_workspace(codes.device),
             n_ctas or sm_count(codes.device))


_VIEWS = {order: Prepared(size=2) for order in CODES}  # weight views per (weight, codes order): L1 and L2
_PLAN: dict = {}  # the last call's workspace and views (one key: a new shape or stream replaces it)


def _weight_args(w: GroupedWeight, order: str) -> tuple:
    return _VIEWS[order].get((w.codes, w.shift, w.col_scale), lambda: weight_views(w, order))


def _plan(t: int, topk: int, n_experts: int, d: int, i: int, max_m: int | None, device) -> dict:
    """The layer's intermediate buffers (dispatch layout, h and its scales, L2's rows) and the kernels'
    views of them, made once per (shape, device, stream) by glue.planned (v1 allocated them and rebuilt
    every view in each call)."""
    def make(lay: dict) -> dict:
        rows = lay["src"].numel()
        h = torch.empty(rows, i, dtype=torch.uint8, device=device)
        h_s = torch.empty((i // KBLOCK, rows) if max_m is None else (n_experts, i // KBLOCK, max_m),
                          dtype=torch.float32, device=device)
        y_rows = torch.empty(rows, d, dtype=torch.bfloat16, device=device)
        return {"lay": lay, "y_rows": y_rows, "dispatch": dispatch_args(lay, max_m),
                "group": lay["counts"] if max_m is not None else lay["expert"],
                "l1_act": act_views(lay["codes"], lay["scales"], max_m), "l1_out": (h, act_views(h, h_s, max_m)[1]),
                "l2_act": act_views(h, h_s, max_m), "l2_out": (y_rows.view(torch.int32), _unused_scales(device)),
                "ctx": (_table(device), _split_workspace(device), sm_count(device))}

    return planned(_PLAN, make, t, topk, n_experts, d, i, max_m, device)


def run_layer(compiled: CompiledLayer, x, idx, weights, shared, experts: tuple, n_experts: int, max_m: int | None,
              y: torch.Tensor | None = None, check: bool = True, mean_rows: float | None = None) -> torch.Tensor:
    """y = bf16(Σ_k expert_k(x) · w_k + shared) through our four kernels; experts = (w1, s1, w3, s3, w2, s2).

    Masked layout: a count past max_m drops the entries past max_m on the device; with `check` (the default)
    the call then reads the counts back (a host sync, after every launch) and raises a ValueError. A caller
    whose max_m is a bound by construction passes check=False and the call never syncs: max_m >= T when a
    token's k experts are distinct (the router's top-k), >= T * k otherwise, or the largest count, as the
    family's cases size it (kernels/moe/inputs.max_m). v1 always checked: the sync put the host's launch
    overhead and the read-back in the timed region (decode: 44-426 us between the kernels' 65-650 us and
    the measured time, docs/perf/moe.md v2).

    The intermediate buffers and every view the kernels take are made once per shape (`_plan`), the
    weights' views once per weight: a call checks its arguments and makes four launches. `mean_rows`: the entries
    over the experts that hold any, where the caller knows it (CompiledLayer.gemms' pick)."""
    l1w, l2w = (row_frame_weights if getattr(compiled, "row_frame", False) else layer_weights)(*experts)
    return run_prepared(compiled, x, idx, weights, shared, l1w, l2w, n_experts, max_m, y, check, mean_rows)


def run_prepared(compiled: CompiledLayer, x, idx, weights, shared, l1w: GroupedWeight, l2w: GroupedWeight,
                 n_experts: int, max_m: int | None, y: torch.Tensor | None = None,
                 check: bool = True, mean_rows: float | None = None) -> torch.Tensor:
    """run_layer on weights already prepared (`layer_weights`, or `row_frame_weights` for a row-frame compile:
    `compiled.frame`; the model's adapter keeps its own per layer). Weights of the other frame raise a
    ValueError (a block-frame weight in a row-frame GEMM would be mis-scaled silently)."""
    k = compiled.kernels
    t, d = x.shape
    i = l1w.shape[1] // 2
    if max_m is not None and n_experts > MAX_GROUPS:
        raise ValueError(f"{n_experts} experts: the masked kernel's work list holds at most {MAX_GROUPS}")
    frame = "row" if getattr(compiled, "row_frame", False) else "block"
    if l1w.frame != frame or l2w.frame != frame:
        raise ValueError(f"the GEMMs were compiled for {frame}-frame weights, got {l1w.frame} / {l2w.frame} "
                         f"(expert_weights.prepare's frame)")
    orders = {compiled.codes, compiled.wide_codes} if compiled.token_tiles else {compiled.codes}
    if "rs" in (l1w.order, l2w.order) and orders != {"rs"}:  # before any launch (weight_views would refuse later)
        raise ValueError(f"the weights hold v5's RS-ordered code tiles only; the GEMMs read {sorted(orders)} codes")
    check_dispatch(x, idx, weights, {}, n_experts, max_m, outputs=False)
    out = torch.empty_like(shared) if y is None else y
    for name, v in (("shared", shared), ("y", out)):
        if v.dtype != torch.bfloat16 or v.shape != x.shape or not v.is_contiguous():
            raise ValueError(f"{name} must be contiguous bf16 {tuple(x.shape)}, got {v.dtype} {tuple(v.shape)}")
    p = _plan(t, idx.shape[1], n_experts, d, i, max_m, x.device)
    table, split, n_sms = p["ctx"]
    if compiled.stamps:
        split = stamp_workspace(x.device)
    fused = idx.numel() <= getattr(compiled, "fused_max", 0)
    k["dispatch@fused" if fused else "dispatch"](x, idx.view(-1), weights.view(-1), *p["dispatch"])
    l1, l2, order = compiled.gemms(max_m, mean_rows, idx.numel(), n_sms)
    l1(*p["l1_act"], *_weight_args(l1w, order), table, p["group"], p["lay"]["row_weight"], *p["l1_out"], *split, n_sms)
    l2(*p["l2_act"], *_weight_args(l2w, order), table, p["group"], p["lay"]["row_weight"], *p["l2_out"], *split, n_sms)
    k["combine"](p["y_rows"], p["lay"]["pos"], shared, out)
    if check and max_m is not None:
        check_fits(p["lay"]["counts"], max_m)
    return out
