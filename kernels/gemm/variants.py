"""Declared variants of the gemm kernel: the shipped tile rule (kernels/gemm/config.py) with one knob
overridden, each `cutedsl:<name>`, timed through the harness beside the shipped rule and the peers on
the same inputs:

    dsv4bench sweep gemm --rows 4096 --examples 0 --bench \\
        --impl cutedsl,cutedsl:bm128,cutedsl:bn64,cutedsl:g16,deepgemm,cublaslt

Every variant but the ko-* knock-outs computes the real answer (it must pass the oracle); one whose
override makes an impossible configuration is UNSUPPORTED there.

    bmB / bnB       CTA tile rows B (64, 128, 256) / columns B (32, 64, 128) instead of the rule's;
                    bn192: 128 x 192 tiles
    gG              rasterisation groups of G M-tiles (1, 4, 16; shipped 8)
    no-split        split-K off (decode shapes that the rule splits); bn64-no-split, bn32-no-split both
    bm64-bnB-kS     64 x B tiles in S slices at any M, K blocks chained as the rule chains bm 64
    bm128-bnB-kS    128 x B tiles in S slices (1, 2, 4), bm256-bnB 256 x B: one M tile at M 65-256, full rings;
    bm128-bnB-ckS   128 x B tiles in S = 2-4 slices as one cluster merging in shared memory; bm64-bn192 64 x 192
    kS, bnB-kS      split-K in S slices (2, 4), with the rule's or B columns (bn32-k2 too)
    sS              S smem ring stages instead of the rule's
    pdl, no-pdl     launched with (without) programmatic dependent launch: in quant+gemm the GEMM starts while
                    the quant kernel runs and loads its first ring-full of weights before griddepcontrol.wait (the
                    rule's quant+gemm at M <= 64: config.choose_quant_gemm_config)
    ck, ckS         split-K slices of a tile as one cluster merging in shared memory (GemmConfig.cluster_k):
                    the rule's slices, or S = 2, 3, 4, 8; bn32-ckS (S 2-4), bn64-ckS (2, 3, 4, 8), bn128-ck8
    ring-full       as many stages as fit (v8's decode rings; the rule caps bn <= 64 decode rings at 64 KB of weight)
    bn64-s8         64-column tiles with an 8-stage ring (64 KB of weight in flight)
    wg-epi          per-warpgroup epilogue (GemmConfig.epi_per_wg)
    epi4            4 epilogue buffers and a 5-stage ring: no slice waits for an earlier slice's TMA store (bm 128)
    chainC          K block kb + 1's wgmmas issued before kb is promoted, in chains of C = 2, 4, 8, 16, 32 blocks
                    (0: off; one wave: bm <= 128); chain4-bnB, chain4-bn32-no-split; bm128-bn128-chainC (C 4, 8)
    no-xbox         x and sa in TMA boxes of the decode tile's bm rows (the rule: M rounded up to 1 / 2 / 4 / 8, x_box)
    x64             the v7 rule: 64-row x tiles at every decode M (today's takes 16 / 32 rows up to M 16 / 32)
    unrollU         the K-block loops (consumers and producer) unrolled U = 1 (v6), 2, 8 times (shipped 4)
    x1              no CTA pairs (GemmConfig.cluster_n 1) where the rule pairs bm 256 tiles
    pair            256 x 128 CTA pairs wherever they fit (the rule's prefill pick before bn 192); pair-bn32 / -bn64
    ko-no-promote   knock-outs (checked = False: timed, never compared): no promotion (a plain FP8
    ko-const-scale  GEMM), promotion without the scale loads; the gap to the shipped kernel is what
    ko-half-a       that part costs. half-a: the second wave's x tile is not loaded (bm 256), no-b:
    ko-no-b         the W tile is not loaded: the L2 -> SM bytes a 2-CTA multicast would save. (No "skip the store"
                    knock-out: with nothing stored, the compiler drops the promotion and scale loads too, so it times a
                    plain GEMM again.)
    ko-no-aux       each stage loads its W tile alone (no x tile, no scale boxes): what the three small copies beside a
                    decode stage's W box cost. no-b and no-aux run chained tiles too (the consumers' loop unchanged)
    ko-half-k       2 of each K block's 4 wgmmas (chained too): what the tensor core's share of a block costs

Imported at the end of kernels/gemm/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

from dataclasses import replace

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.gemm.family import GemmCuteDSL
from kernels.gemm.config import CHAIN, H100_SMS, box_rows
from kernels.gemm.glue import check_cluster_round, groups_of, pairs_share_x
from kernels.gemm.tiling import GemmConfig, straddles_groups
from kernels.knobs import ConfigKnobs

KNOBS: dict[str, dict] = {
    "no-split": {"split_k": 1},
    **{f"bm{b}": {"bm": b} for b in (64, 128, 256)},
    **{f"bn{b}": {"bn": b} for b in (32, 64, 128)},
    # two weight-scale blocks a tile (one wave, unchained; DeepGEMM's pro.wq_a pick)
    "bn192": {"bm": 128, "bn": 192, "chain": 0},
    **{f"g{g}": {"group_m": g} for g in (1, 4, 16)},
    **{f"s{s}": {"stages": s} for s in (2, 4)},
    "ring-full": {"stages": 0},
    "pdl": {"pdl": True},
    "no-pdl": {"pdl": False},
    "ck": {"cluster_k": True},
    **{f"ck{s}": {"split_k": s, "cluster_k": True} for s in (2, 3, 4, 8)},
    **{f"bn32-ck{s}": {"bn": 32, "split_k": s, "cluster_k": True, "stages": 16} for s in (2, 3, 4)},
    # the 64 KB decode ring (16 / 8 stages of bn 32 / 64)
    **{f"bn64-ck{s}": {"bn": 64, "split_k": s, "cluster_k": True, "stages": 8} for s in (2, 3, 4, 8)},
    "bn128-ck8": {"bn": 128, "split_k": 8, "cluster_k": True, "stages": 0},
    "bn64-s8": {"bn": 64, "stages": 8},  # the decode ring cap's 64 KB on bn 64 where the rule takes bn 128
    "bn64-no-split": {"bn": 64, "split_k": 1},  # DeepGEMM's decode pick for the largest weights
    "bn32-no-split": {"bn": 32, "split_k": 1},
    "bn32-k2": {"bn": 32, "split_k": 2},
    # 64-row tiles past M = 64 (the rule takes 128 / 256 there): one consumer warpgroup, 4x the CTAs
    **{f"bm64-bn{b}-k{s}": {"bm": 64, "bn": b, "split_k": s, "chain": CHAIN} for b in (32, 64, 128) for s in (1, 2)},
    # one M tile of 128 / 256 rows past M = 64 (the weight read once; the rule's bm 64 / 128 read it twice), full rings
    **{f"bm128-bn{b}-k{s}": {"bm": 128, "bn": b, "split_k": s, "stages": 0, "chain": 0}
       for b in (32, 64, 128) for s in (1, 2, 4)},
    **{f"bm256-bn{b}": {"bm": 256, "bn": b, "split_k": 1, "stages": 0, "chain": 0} for b in (32, 64, 128)},
    "bm64-bn192": {"bm": 64, "bn": 192, "split_k": 1, "stages": 0, "chain": 0},
    **{f"bm128-bn{b}-ck{s}": {"bm": 128, "bn": b, "split_k": s, "cluster_k": True, "stages": 0, "chain": 0}
       for b in (32, 64, 128) for s in (2, 3, 4)},
    **{f"k{s}": {"split_k": s} for s in (2, 4)},
    **{f"bn{b}-k{s}": {"bn": b, "split_k": s} for b in (64, 128) for s in (2, 4)},
    "wg-epi": {"epi_per_wg": True},  # each warpgroup stores its own rows, no CTA barrier per slice
    "epi4": {"stages": 5, "epi_stages": 4},  # a 128 x 128 tile's four O slices in flight at once (a ring stage fewer)
    **{f"unroll{u}": {"unroll": u} for u in (1, 2, 8)},  # the K-block loops' unroll (shipped: 4; v6: 1)
    # K block kb + 1 issued before kb is promoted, in chains of C blocks (one wave: bm <= 128)
    **{f"chain{c}": {"chain": c} for c in (0, 2, 4, 8, 16, 32)},  # 0: unchained (v7's loop)
    **{f"bm128-bn128-chain{c}": {"bm": 128, "bn": 128, "split_k": 1, "stages": 0, "chain": c} for c in (4, 8)},
    **{f"chain4-bn{b}": {"chain": 4, "bn": b} for b in (32, 64, 128)},
    "chain4-bn32-no-split": {"chain": 4, "bn": 32, "split_k": 1},
    "no-xbox": {"x_box": 0},  # the decode tiles' x and sa in boxes of bm rows (the rule: M rounded up, config.box_rows)
    "x1": {"cluster_n": 1},  # single CTAs where the rule pairs them (bm 256)
    "pair": {"bm": 256, "bn": 128, "cluster_n": 2},  # 256 x 128 CTA pairs wherever they fit
    **{f"pair-bn{b}": {"bm": 256, "bn": b, "cluster_n": 2, "split_k": 1, "stages": 0, "chain": 0} for b in (32, 64)},
}
# knock-outs (GemmConfig.ablate): timed, never compared (UNCHECKED)
KNOCKOUTS = ("no-promote", "const-scale", "half-a", "no-b", "no-aux", "half-k")


class GemmKnob(ConfigKnobs, GemmCuteDSL):
    """The shipped kernel with the rule's configuration overridden by `knobs`."""

    def config(self, case: Case) -> GemmConfig:
        knobs = dict(self.knobs)
        if knobs.get("bm", 0) > 128:  # two waves take no split-K
            knobs.setdefault("split_k", 1)
        if knobs.get("bm", 256) < 256 or knobs.get("split_k", 1) > 1 or knobs.get("ablate") == "half-a":
            knobs.setdefault("cluster_n", 1)  # pairs need bm 256 without split-K
        base = GemmCuteDSL.config(self, case)
        knobs.setdefault("x_box", box_rows(case["m"], knobs.get("bm", base.bm)))  # the rule's box for the knob's bm
        cfg = replace(base, **knobs)
        if straddles_groups(cfg.bn, case["n"], groups_of(case)):
            raise ValueError(f"{cfg.bn}-column tiles would straddle a weight group of {case['n'] // groups_of(case)}")
        if not pairs_share_x(cfg, case["n"], groups_of(case)):
            raise ValueError(f"a CTA pair's two N tiles would straddle a weight group of {case['n'] // groups_of(case)}")
        check_cluster_round(cfg, case["m"], case["n"], H100_SMS)  # the rule's part
        return cfg


class GemmRowFloor(GemmKnob):
    """`cutedsl:x64`: the v7 rule, 64-row x tiles at every decode M (GemmCuteDSL.min_rows)."""

    min_rows = 64


class GemmKnockOut(GemmKnob):
    checked = False  # the output is not an answer


VARIANTS = tuple(GemmKnob(name, knobs) for name, knobs in KNOBS.items()) + tuple(
    GemmKnockOut(f"ko-{name}", {"ablate": name}) for name in KNOCKOUTS) + (GemmRowFloor("x64", {}),)
for _impl in VARIANTS:
    register_impl(_impl)
