"""The moe family: DSV4's routed experts (spec §8, issue #22), three ops (`op` of a case, sweeps/moe.py).

layer: y = bf16( Σ_k expert_{idx_k}(x; w_k) + shared ), the routed experts in the checkpoint's MXFP4
    format (w1 / w3 [E, I, D/2] int8 + e8m0 scales [E, I, D/32], w2 [E, D, I/2] + [E, D, I/32];
    kernels/moe/inputs.py), x bf16 [T, D], the router's idx int32 / weights fp32 [T, 6], and the
    shared expert's output bf16 [T, D] (an FP8 linear pair: the gemm family's). Oracle: oracles.moe
    `routed` in fp32 on the dequantised weights + shared. Low-precision reference: `routed_lowprec`,
    the reference's path: FP8 e4m3 activations per 128 (ue8m0), fp32 accumulation over the
    dequantised MXFP4 weights, bf16 w1 / w3 outputs, SwiGLU and the route weight in fp32, bf16 h
    quantised again for w2, each expert's bf16 output summed in fp32 with the shared output.
    Ours (sm_90a): dispatch -> the grouped MXFP4 x FP8 GEMMs (L1 with the SwiGLU x route weight and h's FP8
    quantisation fused, L2; v5 at decode: kernels/moe/grouped_rs.py, v3 at prefill: kernels/moe/grouped_split.py
    on row-frame weights) -> combine (kernels/moe/layer.py); the CUDA-core GEMV path (kernels/moe/gemv_layer.py) is
    a declared variant. The weights' side data is made once per weight buffers. Peers: kernels/moe/peers.py.
dispatch: the router's output -> the layout (contiguous or masked) with x gathered and FP8-quantised
    (kernels/moe/dispatch.py). Oracle = reference = oracles.moe `dispatch_layout` + `gather_quant`;
    every output compares exactly.
combine: the layout rows (bf16, route weights already applied) back to token order + the shared
    output (kernels/moe/combine.py). Oracle: oracles.moe `combine` in fp32; reference: the same cast
    to bf16.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from kernels.moe import peers
from kernels.moe import serves as served
from kernels.moe.gemv_layer import compile_gemv_layer, pick_tmax, refusal, run_gemv_layer
from kernels.moe.glue import alloc_dispatch, compile_combine, compile_dispatch, layout_size, run_combine, run_dispatch
from kernels.moe.grouped_config import MAX_GROUPS, V2, V3, V4, V5, V7, V8_DECODE, V8_PREFILL, V8_WIDE, V19, V23, V24
from kernels.moe.inputs import StackedExperts, counts, expert_bytes, make_experts, max_m, mean_rows, routing
from kernels.moe.layer import SM90_ONLY, compile_layer, run_layer
from oracles.moe import combine, dispatch_layout, gather_quant, routed, routed_lowprec
from sweeps import moe as space

# The layer quantises two activations to FP8 e4m3 (x, then h), ~2.5% rms relative error each, and the
# SwiGLU carries x's error into h: the reference itself is 3-5% (relative L2) from the FP32 math
# (4.6-4.9% at the Flash decode shapes, on the CPU). The bound is twice that; the max-error rule
# (2x the reference's) is the sharp one.
LAYER_REL_L2 = 0.1
PADDING_SENTINEL = 1e30  # combine inputs: layout rows no token reads (a kernel that reads one fails)
WEIGHT_NAMES = ("w1", "s1", "w3", "s3", "w2", "s2")


def case_max_m(case: Case) -> int | None:
    return max_m(case) if case["layout"] == "masked" else None


def experts_of(inputs: dict) -> StackedExperts:
    return StackedExperts(*(inputs[n] for n in WEIGHT_NAMES))


def layout_of(case: Case, idx: torch.Tensor, weights: torch.Tensor) -> dict:
    """The dispatch layout of a router output for the case's experts and layout (oracles.moe)."""
    m = case_max_m(case)
    return dispatch_layout(idx, weights, case["e"], layout_size(case["t"], case["k"], case["e"], m), m)


class MoeFamily(Family):
    name = "moe"
    description = ("routed MoE experts (MXFP4 w1/w3/w2, FP8 acts per 128, clamped SwiGLU x route weight): the "
                   "layer, and its dispatch (permutation + FP8 quant into the grouped-GEMM layout) and combine")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model op it serves (kernels/moe/serves.py)
    options = {
        "op": Option("op", "layer (whole routed layer), dispatch or combine", choices=space.OPS, names=True),
        "model": Option("model", "DSV4 model of the shape (drawn: hypothesis)", choices=("flash", "pro", "drawn"),
                        names=True),
        "tokens": Option("t", "tokens T (decode 1-256: masked layout; prefill: contiguous)", "tokens"),
        "load": Option("load", "expert load: uniform, zipf, hot (one expert gets every token), sparse (empty "
                       "experts), hash (a token may hit one expert twice)", choices=space.LOADS, names=True),
        "layout": Option("layout", "masked [E, max_m, D] (decode) or contiguous (prefill)",
                         choices=("masked", "contiguous"), names=True),
        # the grid caps the experts (sweeps/moe.py EXPERT_CAP: device memory); a real layer routes over all of them
        "experts": Option("e", "routed experts a case instantiates (the grid: Flash 64 of 256, Pro 16 of 384; a value "
                          "off the grid adds every grid case at it: --model flash --experts 256 is Flash's real "
                          "layer)", "experts", extends=True),
    }

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        if case["op"] == "layer":
            return Tolerance(ratio=2.0, rel_l2=LAYER_REL_L2)
        return Tolerance(exact=True) if case["op"] == "dispatch" else self.tolerance

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        t, d = case["t"], case["d"]
        idx, w = routing(case)
        if case["op"] == "layer":
            dev_gen = torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
            experts = make_experts(case["e"], d, case["i"], dev_gen, device)
            return {"x": (torch.randn(t, d, generator=gen) * 2).bfloat16().to(device), "idx": idx.to(device),
                    "weights": w.to(device), "shared": torch.randn(t, d, generator=gen).bfloat16().to(device),
                    **{n: getattr(experts, n) for n in WEIGHT_NAMES}}
        if case["op"] == "dispatch":  # rows of magnitudes 2^-8 .. 2^8, one below the FP8 amax floor
            x = torch.randn(t, d, generator=gen) * torch.exp2(torch.empty(t, 1).uniform_(-8, 8, generator=gen))
            x[0] *= 1e-7
            return {"x": x.bfloat16().to(device), "idx": idx.to(device), "weights": w.to(device)}
        layout = layout_of(case, idx, w)
        rows = torch.randn(layout["src"].numel(), d, generator=gen) * 4
        rows[layout["src"] < 0] = PADDING_SENTINEL
        return {"rows": rows.bfloat16().to(device), "pos": layout["pos"].to(device),
                "shared": torch.randn(t, d, generator=gen).bfloat16().to(device)}

    def oracle(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "dispatch":
            return self.lowprec(case, inputs)
        if case["op"] == "combine":
            return {"y": combine(inputs["rows"], inputs["pos"], inputs["shared"])}
        x = inputs["x"]
        return {"out": routed(x, inputs["weights"], inputs["idx"], experts_of(inputs)) + inputs["shared"].float()}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "dispatch":
            layout = layout_of(case, inputs["idx"], inputs["weights"])
            groups = 1 if case["layout"] == "contiguous" else case["e"]
            codes, scales = gather_quant(inputs["x"], layout["src"], groups)
            return {**layout, "codes": codes, "scales": scales}
        if case["op"] == "combine":
            return {"y": self.oracle(case, inputs)["y"].bfloat16()}
        y = routed_lowprec(inputs["x"], inputs["weights"], inputs["idx"], experts_of(inputs))
        return {"out": (y + inputs["shared"].float()).bfloat16()}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        t, d = case["t"], case["d"]
        if case["op"] == "dispatch":
            return alloc_dispatch(t, case["k"], case["e"], d, case_max_m(case), device)
        name = "y" if case["op"] == "combine" else "out"
        return {name: torch.empty(t, d, dtype=torch.bfloat16, device=device)}

    def cost(self, case: Case) -> Cost:
        """layer: 6 flops per entry x D x I (w1, w3, w2); bytes: the weights of every expert that gets a
        token (the decode floor), x, the shared output, y and the router output.
        dispatch: the router output, x once, the layout written (codes, scales, row metadata).
        combine: the k rows of each token, the shared output, y (bf16), pos."""
        t, d, k, e = case["t"], case["d"], case["k"], case["e"]
        entries = t * k
        if case["op"] == "layer":
            used = int((counts(case) > 0).sum())
            return Cost(flops=6.0 * entries * d * case["i"],
                        bytes=float(used * expert_bytes(d, case["i"]) + 3 * t * d * 2 + entries * 8))
        if case["op"] == "dispatch":
            rows = layout_size(t, k, e, case_max_m(case))
            return Cost(flops=4.0 * entries * d,
                        bytes=float(entries * 8 + t * d * 2 + rows * (d + d // 32 + 12) + e * 4 + entries * 4))
        return Cost(flops=float(entries * d), bytes=float(entries * d * 2 + 2 * t * d * 2 + entries * 4))


class MoeCuteDSL(Impl):
    family, name, backend = "moe", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["op"] != "layer":
            return None
        if arch not in (None, "sm_90a"):
            return SM90_ONLY
        if case["layout"] == "masked" and case["e"] > MAX_GROUPS:  # `--experts` may ask for more
            return f"{case['e']} experts: the masked layout's work list holds at most {MAX_GROUPS}"
        return None if case["i"] % 128 == 0 else f"I={case['i']} must be a multiple of 128 (L1's 256-row tile)"

    knobs: dict = {}  # GroupedConfig overrides (declared variants)

    def compile_key(self, case: Case, arch: str) -> tuple:
        if case["op"] == "layer":
            return (self.family, self.name, arch, "layer", case["e"], case["k"], case["d"], case["i"], case["layout"],
                    tuple(sorted(self.knobs.items())))
        if case["op"] == "dispatch":
            return (self.family, self.name, arch, "dispatch", case["e"], case["k"], case["d"], case["layout"])
        return (self.family, self.name, arch, "combine", case["d"], case["k"])

    def compile(self, case: Case, arch: str):
        if case["op"] == "dispatch":
            return compile_dispatch(case["e"], case["k"], case["d"], case["layout"], arch)
        if case["op"] == "combine":
            return compile_combine(case["d"], case["k"], arch)
        return compile_layer(case["e"], case["k"], case["d"], case["i"], case["layout"], arch, **self.knobs)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        if case["op"] == "layer":
            experts = tuple(inputs[n] for n in WEIGHT_NAMES)
            # max_m is the case's largest count (inputs.max_m): it fits by construction, so no read-back. The grouped
            # GEMMs' pick also reads the mean count (the wide pair: grouped_config.WIDE_MEAN)
            args = (compiled, inputs["x"], inputs["idx"], inputs["weights"], inputs["shared"], experts, case["e"],
                    case_max_m(case), out["out"])
            mean = mean_rows(case) if case["layout"] == "masked" else None
            run_layer(*args, check=False, mean_rows=mean)
            return out
        if case["op"] == "dispatch":
            return run_dispatch(compiled, inputs["x"], inputs["idx"], inputs["weights"], out, case["e"],
                                case_max_m(case))
        run_combine(compiled, inputs["rows"], inputs["pos"], inputs["shared"], out["y"])
        return out


class MoeLayerVariant(MoeCuteDSL):
    """Declared variants of the layer's grouped GEMMs (GroupedConfig overrides), run only when named; `cutedsl` is
    the tile rule's pick (grouped_config.choose). Versions: `:v2` / `:v3` at both layouts (the v2 A/Bs carry
    grouped_config.V2, so they stay on v2 at prefill), `:v4`, `:v5` (decode: swap-AB, weights widened in registers
    as an RS wgmma's A, kernels/moe/grouped_rs.py; `:v5-bm16` / `-bm32` one token tile, `:v5-no-pdl` without PDL),
    `:v7` (v3 skipping a tile's all-padding second wave), `:v3-rs` (v3 on v5's RS code tiles at every count), `:v10`
    / `:v12` (the rule before v11's tail split / v13's early L2 weights), `:v13` (before v14's one-launch dispatch).
    A/Bs: `:serial` (widen a K block before its wgmmas, not during the previous block's), `:tiled-b` (codes in
    load-time 16 KB tiles), `:pdl` (programmatic dependent launch), `:split-wg` (each consumer warpgroup widens its
    own rows: kernels/moe/grouped_split.py), `:fused-dispatch` (v14's one-launch masked dispatch at every T, past
    its MAX_ASSIGNMENTS), `:v14` (the rule before v15's tail split of the wide pair, layer.compile_layer), `:v15`
    (before v16: v13's early L2 weights for the wide pairs too), `:v8-prefill` (the prefill pick before v19: v7 on
    the RS code tiles), `:v19` (the prefill pick before v23: two widened B buffers), `:v23` (before v24: 96
    hand-over arrives a widened tile, not 3), `:v16` / `:v27` (the decode rule before v27 / v29). Set aside after
    measuring: early L1 weights (`git show 0ca828c`; v30, L1 counting its rows from the top-k ids, `git show
    1d14b19`), v5's FP4 tiles by bulk copies (v28, `git show 86384f9`), L2's codes prefetched into L2 (`git show
    2204250`), prefill's widening split over both waves (`:split-widen`, `git show b39264f`), v19 with the TMA warp
    a fourth widener (`:v20`, `git show ce4d6ae`), v19's consumer warpgroups taking turns at the tensor pipe
    (`:v21`, `git show 85c26b4`), v19 testing the next K block's barriers under its wgmmas (`:v22`, `git show
    f747d88`), v5's swap-AB kernel at 128 tokens a tile (`:v17`, four 64 x 64 waves a K block, `git show 447b913`;
    `:v18`, a unit's rows in two passes of one m64n128 wave, `git show 3b19bd6`). Knock-outs (timed, never compared;
    checked False): `:ko-no-widen`, `:v3-`, `:v4-`, `:v23-ko-no-widen`, `:v24-ko-half-widen`, `:v8-ko-no-widen` /
    `-no-mma` (v5 without its widening / its wgmmas), `:v10-ko-stream` (both: the weight stream alone). Set aside in
    session 43: v25 (CTA pairs sharing the widened tile, `git show 81b2135`), v26 (the codes in a ring of their own,
    `git show 1adfd59`; refilled by the wideners, `git show bb4a20e`). History: docs/perf/moe.md; v1 `git show
    e494048`, v6 `git show 936ce77`."""

    def __init__(self, variant: str, knobs: dict, checked: bool = True):
        self.name, self.variant, self.knobs, self.checked = f"cutedsl:{variant}", variant, knobs, checked

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["op"] != "layer":
            return "a variant of the layer's GEMMs only"
        if self.knobs.get("swap_ab") and case["layout"] != "masked":
            return "v5 (swap-AB) is a decode kernel: masked layout only"
        if self.knobs.get("skip_padding_wave") and case["layout"] != "contiguous":
            return "v7 (skip_padding_wave) is a prefill kernel: contiguous layout only"
        return super().supports(case, arch)


class MoeGemv(MoeCuteDSL):
    """`cutedsl:gemv`: the CUDA-core decode path (kernels/moe/gemv_sm90.py, kernels/moe/gemv_layer.py): dispatch ->
    GEMV L1 -> GEMV L2 -> combine on the masked layout (the compiled tmax is the smallest of 1, 2, 4 that
    holds the case's largest count, known on the host from its routing; an expert with more runs in
    chunks of 4). No wgmma: it compiles for sm_90a and sm_100a. Reads the checkpoint's weight buffers as
    they are (no load-time layout)."""

    name, variant = "cutedsl:gemv", "gemv"  # a declared variant: run only when `--impl` names it

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["op"] != "layer":
            return "a variant of the layer's GEMMs only"
        if arch not in (None, "sm_90a", "sm_100a"):
            return f"the GEMV path compiles for sm_90a and sm_100a, not {arch}"
        if case["layout"] != "masked":
            return "the GEMV path is for decode (masked layout); prefill (contiguous) runs the grouped GEMMs"
        return refusal(case["d"], case["i"])

    balance = False  # units of 16 row pairs; `cutedsl:gemv-fine` sizes them by gemv_layer.pick_pairs

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, "layer", case["e"], case["k"], case["d"], case["i"],
                pick_tmax(int(counts(case).max())))

    def compile(self, case: Case, arch: str):
        return compile_gemv_layer(case["e"], case["k"], case["d"], case["i"], pick_tmax(int(counts(case).max())),
                                  arch, balance=self.balance)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        experts = tuple(inputs[n] for n in WEIGHT_NAMES)
        run_gemv_layer(compiled, inputs["x"], inputs["idx"], inputs["weights"], inputs["shared"], experts,
                       case["e"], case_max_m(case), out["out"])
        return out


class MoeGemvFine(MoeGemv):
    """`cutedsl:gemv-fine`: the GEMV path with units of 8 or 4 row pairs where 16 would leave a quarter of
    the CTA slots idle at one token (Flash L1 and L2, Pro L2; gemv_layer.pick_pairs)."""

    name, variant, balance = "cutedsl:gemv-fine", "gemv-fine", True


FAMILY = register_family(MoeFamily())
register_impl(MoeCuteDSL())
# v2's A/Bs carry V2: the tile rule's prefill pick is v3 (grouped_config.choose), their prefill cases stay on v2
register_impl(MoeLayerVariant("v2", V2))
register_impl(MoeLayerVariant("serial", {**V2, "overlap": False}))
register_impl(MoeLayerVariant("ko-no-widen", {**V2, "ablate": "no-widen"}, checked=False))
register_impl(MoeLayerVariant("tiled-b", {**V2, "tiled_b": True}))
register_impl(MoeLayerVariant("pdl", {**V2, "pdl": True}))
register_impl(MoeLayerVariant("split-wg", {**V2, "split_wg": True}))
register_impl(MoeLayerVariant("v3", V3))
register_impl(MoeLayerVariant("v7", V7))
# v3 on v5's RS-ordered code tiles (the rule's wide pair, here at every count)
register_impl(MoeLayerVariant("v3-rs", V8_WIDE))
register_impl(MoeLayerVariant("v4", V4))
register_impl(MoeLayerVariant("v5", V5))
register_impl(MoeLayerVariant("v5-bm16", {**V5, "bm": 16}))
register_impl(MoeLayerVariant("v5-bm32", {**V5, "bm": 32}))
register_impl(MoeLayerVariant("v5-no-pdl", {**V5, "pdl": False}))
register_impl(MoeLayerVariant("v4-ko-no-widen", {**V4, "ablate": "no-widen"}, checked=False))
register_impl(MoeLayerVariant("v3-ko-no-widen", {**V3, "ablate": "no-widen"}, checked=False))
# v8's decode knock-outs (v5's K block without its widening / without its wgmmas; the wide pair runs whole under
# no-mma): where the K block's time goes
register_impl(MoeLayerVariant("v8-ko-no-widen", {**V8_DECODE, "ablate": "no-widen"}, checked=False))
register_impl(MoeLayerVariant("v8-ko-no-mma", {**V8_DECODE, "ablate": "no-mma"}, checked=False))
# ... and both at once: the weight stream through v10's ring alone (the codes XORed into a sink)
register_impl(MoeLayerVariant("v10-ko-stream", {**V8_DECODE, "ablate": "stream"}, checked=False))
# the rule with v5's phase stamps (GroupedConfig.stamps, benchmarks/moe_phases.py) and no tail-split build (the stamps
# take its workspace)
register_impl(MoeLayerVariant("stamps", {"stamps": True, "tail_split": False}))
# the decode rule before v27: the row frame's column scales read at every stage (GroupedConfig.row_scale_once off), no
# v29 reads
register_impl(MoeLayerVariant("v16", {"row_scale_once": False, "early_reads": False}))
# the decode rule before v29: the route weights read in L1's epilogue, combine and the fused dispatch reading after
# their dependences (compile_layer's early_reads off)
register_impl(MoeLayerVariant("v27", {"early_reads": False}))
# v10 with the tail round of v5's units split in K (kernels/moe/grouped_slices.py)
# the rule before v11: no tail-split build beside the smallest token tile (nor v13's early L2 weights)
register_impl(MoeLayerVariant("v10", {"tail_split": False, "l2_early": False, "fused_dispatch": 0}))
# the rule before v13: v5's L2s wait under PDL before reading their work list and first weight stages
register_impl(MoeLayerVariant("v12", {"l2_early": False, "fused_dispatch": 0, "wide_split": False}))
# the rule before v14: the masked dispatch always in two launches (layout, then gather + quant)
register_impl(MoeLayerVariant("v13", {"fused_dispatch": 0, "wide_split": False, "wide_early": False}))
# v14's one-launch masked dispatch at every T (kernels/moe/dispatch_fused.py): the A/B of its MAX_ASSIGNMENTS
register_impl(MoeLayerVariant("fused-dispatch", {"fused_dispatch": 1 << 30}))
# the rule before v15: no tail-split build of the wide pair (v3's 64-row tile; v15 splits capped Pro T = 64 sparse's
# tail: 6 experts x 24 / 28 n tiles = 144 / 168 units on 132 SMs, two rounds each)
register_impl(MoeLayerVariant("v14", {"wide_split": False, "wide_early": False}))
# the rule before v16: the wide pairs' L2s (v3) wait under PDL before reading their work list and first weight stages
register_impl(MoeLayerVariant("v15", {"wide_early": False}))
# the prefill pick before v19 (v7 on the RS code tiles, its consumers widening)
register_impl(MoeLayerVariant("v8-prefill", V8_PREFILL))
# the prefill pick before v23 (v19: two widened B buffers)
register_impl(MoeLayerVariant("v19", V19))
# v23 (v24 but for its hand-over) with its widening knocked out (the wideners only hand the B buffers over): what its
# consumer loop alone takes
register_impl(MoeLayerVariant("v23-ko-no-widen", {**V23, "ablate": "no-widen"}, checked=False))
# v24 widening rows 0-127 of each tile only (wrong answers): the ceiling of a widened tile shared by a CTA pair
register_impl(MoeLayerVariant("v24-ko-half-widen", {**V24, "ablate": "half-widen"}, checked=False))
# the prefill pick before v24 (v23: each widener thread arrives on the widened tile's full barrier)
register_impl(MoeLayerVariant("v23", V23))
register_impl(MoeGemv())
register_impl(MoeGemvFine())
peers.register()
