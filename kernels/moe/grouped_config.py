"""Compile-time configuration of the grouped expert GEMM (kernels/moe/grouped_sm90.py: v2; its v3,
kernels/moe/grouped_split.py) and its shared-memory budget; `choose` is the tile rule (v2 at decode, v3 at
prefill).

CTA tile bm x bn (bn = BN = 256 weight rows): two consumer warpgroups split N (128 columns each, a
64 x 128 fp32 accumulator per 64-row wave), bm = 64 (decode: one wave) or 128 (prefill: two waves).
Layer 1's 256 interleaved rows are 128 intermediates: exactly one FP8 quantisation block of h, so the
epilogue's block amax is a quad shuffle plus one exchange between the two warpgroups.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.gemm.tiling import KBLOCK, SMEM_BYTES
from oracles.moe import TILE_M  # the contiguous layout's segment alignment

BN = 256
LAYOUTS = ("masked", "contiguous")
EPILOGUES = ("swiglu", "bf16")  # layer 1 (SwiGLU x route weight -> FP8 h + scales), layer 2 (bf16 rows)
MAX_STAGES = 8
ABLATIONS = ("", "no-widen", "no-mma", "stream", "half-widen")
WIDEN_TABLE_WORDS = 40  # kernels/moe/expert_weights.SHIFTS x 2
CODES = ("plain", "tiled", "rs")  # GroupedConfig.codes
SWAP_BM = (16, 32)  # v5's token tiles (the wgmma's N)
WIDE_M = 64  # the rule's decode pick: v5 up to this many rows an expert (max_m), v3 (v4 beside block-frame v5) past it
# ... and v3 where the experts that hold rows average more than v5's widest tile (CompiledLayer.gemms' mean_rows):
# there v5 widens each weight tile once a 32-token tile, v3 once a 64-row wave. H200, one process (docs/perf/moe.md
# "v8"): T = 64 sparse Flash 100.9 -> 77.7 us, Pro 203.9 -> 197.9; at means <= 24 (uniform, hot, zipf) v3 1.06-1.35x
# slower
WIDE_MEAN = 32
REGISTER_FILE = 65536  # 32-bit registers an SM
WIDENER_WARPS = 3  # v19: warps 1-3 of the producer warpgroup widen (96 threads: 10-11 items each a 256-row stage)
MAX_GROUPS = 512  # experts of a masked layout (the work list's prefix sum lives in shared memory)
MAX_SPLIT = 8  # GroupedConfig.split_k's largest
# GroupedConfig.stamps: int32 slots a CTA (globaltimer_lo ns) and the CTAs a kernel's region holds
STAMPS = ("entry", "work", "issued", "first_full", "loop_done", "exit")
STAMP_SLOTS = 8
STAMP_CTAS = 512
SPLIT_UNITS = 2  # the split workspace holds SPLIT_UNITS x SMs units (kernels/moe/grouped_slices.py): past it no split


@dataclass(frozen=True)
class GroupedConfig:
    layout: str = "masked"
    epilogue: str = "swiglu"
    bm: int = 64
    stages: int = 0  # 0: as many as fit
    # widen the next K block's FP4 tile while this block's wgmmas run (False: widen, then issue; the
    # A/B of the overlap, variant `cutedsl:serial`)
    overlap: bool = True
    # knock-out (wrong answers, timed only: variant `cutedsl:ko-no-widen`): the FP4 tiles still stream in
    # but are not widened; its gap to the shipped kernel is what the widening costs. v5 (swap_ab) also takes
    # "no-mma" (its wgmmas not issued: what the tensor pipe costs; `cutedsl:v8-ko-no-mma`) and "stream" (neither:
    # the codes loaded and XORed into a sink, the stages waited and freed; what the weight stream through the ring
    # alone takes, `cutedsl:v10-ko-stream`); v19's wideners take "half-widen" (rows 0-127 of each tile widened, the
    # rest left as they were: what a CTA would widen were a widened tile shared by two, `cutedsl:v24-ko-half-widen`)
    ablate: str = ""
    # decode (one wave): the promotion's scales loaded and their row x column products formed while the
    # wgmmas run, so after the wait only the 64 FMAs remain (v1: 16 LDS.64 + 64 FMUL + 64 FFMA after it)
    early_scales: bool = True
    # decode (v4): a consumer warp whose 16 accumulator rows of a wave hold no real row of the unit (masked: the
    # expert's count; a 64-row wave holds 1-16 real rows at decode, so 3 of each warpgroup's 4 warps) skips the
    # promotion's scale loads and FMAs; its rows are never stored. 1% in CUPTI time, not the ~20% its share of
    # the instructions suggested: the idle warps then wait at the K block's CTA barrier for the live ones
    # (docs/perf/moe.md "v4"). Off: v2 (`cutedsl:v2`, the A/B); on: v4 (`cutedsl:v4`)
    skip_idle_warps: bool = False
    # the weight codes in load-time tiles (expert, n tile, K block, bn rows, 64 bytes): a stage's FP4 tile is
    # one contiguous 16 KB read instead of bn 64-byte pieces 2 KB (L1) / 1 KB (L2) apart (variant
    # `cutedsl:tiled-b`: the DRAM-locality A/B; kernels/moe/layer.tiled_codes)
    tiled_b: bool = False
    # programmatic dependent launch (variant `cutedsl:pdl`): launched with PDL, barrier init and descriptor
    # prefetch before griddepcontrol.wait, dependents triggered right after it (kernels/moe/layer.py
    # passes the flag to dispatch's gather and to combine too)
    pdl: bool = False
    # v5's L2 under PDL (v13, the rule; v3's in the wide pairs too since v16): its work list (the dispatch's counts,
    # complete before L1's own wait returned: L1 triggers L2 only after it) and its first ring's weight tiles are read
    # before griddepcontrol.wait; only h and its scales (L1's) after it
    early_weights: bool = False
    # v3 (prefill; variant `cutedsl:split-wg`, kernels/moe/grouped_split.py): each consumer warpgroup widens
    # only the 128 weight rows its own wgmma reads and publishes them with its own named barrier, so the two
    # warpgroups no longer meet every K block (one promotes and widens while the other's wgmmas run)
    split_wg: bool = False
    # v3 with weights in the row frame (variant `cutedsl:v3`; kernels/moe/expert_weights.prepare frame="row": one
    # column scale per weight row, the same in every K block): the per-K-block promotion is acc += tmp · row_scale
    # (one FFMA an element, no column scales loaded), the column scale applied once in the tile's last K block.
    # On v5 (swap_ab; the rule's decode pick since v8): acc += tmp · sa[token], the weight row's scale once a unit
    # (32 FMUL a K block fewer at 32 tokens: 341 -> 305 SASS instructions a K block in L1, 353 -> 316 in L2)
    row_frame: bool = False
    # v3's L1 epilogue (needs split_wg): silu's division by rcp.approx (v2: the IEEE division, ~8 instructions
    # and a slow-path branch an element) and one 2-byte store per e4m3 pair of h (v2: two 1-byte stores)
    fast_silu: bool = False
    # v7 = v3 on the contiguous layout (the prefill pick): a tile whose second 64-row wave is all padding
    # (its row 64 is padding: a segment of <= 64 rows) issues, waits for and promotes the first wave only. At the
    # models' real expert counts (Pro: 64 rows an expert at T = 4096) about half the tiles
    skip_padding_wave: bool = False
    # v5 (decode; variant `cutedsl:v5`, kernels/moe/grouped_rs.py): swap-AB with the weights as an RS wgmma's A
    # operand: each consumer thread widens its own A fragment in registers (codes in the load-time RS byte order,
    # expert_weights.rs_byte_order), the tokens are the N side (bm = 16 or 32 a tile). No widened tile in shared
    # memory, no fence, no CTA barrier a K block: a stage is freed by its warps' own wgmma waits
    swap_ab: bool = False
    # v3 on the RS-ordered code tiles v5 reads (layer.rs_codes; v8, `cutedsl:v3-rs`): one copy of the codes for every
    # GEMM. An item's 4 code words lie 16 bytes apart: 4 4-byte loads, conflict-free under a 64B-swizzled stage tile
    rs_codes: bool = False
    # v5 (swap_ab) and v3's one-wave masked tile (split_wg, bm 64: the wide pair at decode, v15): the last round's
    # units (units % CTAs: the tail) as up to this many K slices each, as many as the grid holds
    # (kernels/moe/grouped_slices.py, planned on the device from the unit count); every slice adds its fp32 partial
    # into a global workspace and the last to arrive runs the epilogue. 1: no split
    # (layer.compile_layer's "split" pair is split_k MAX_SPLIT)
    split_k: int = 1
    # v19 (the prefill pick since session 41; kernels/moe/grouped_split.py `_widen_loop`): v7 with the widening moved
    # off the consumers: WIDENER_WARPS warps of the producer warpgroup widen each stage's FP4 tile into the B buffers and
    # hand them over by mbarriers; the consumer warpgroups only wait, issue wgmma and promote (DeepGEMM's loop)
    widen_wg: bool = False
    # v19's register split (setmaxnreg): the producer warpgroup's (its widener warps') and each consumer's; producer +
    # 2 x consumer at most 3 x `launch_regs`: the pool setmaxnreg deals from is the launch's allocation, not the file
    # (80 / 216 / 216 asked for 512 and the consumers' increase waited forever: lesson moe 7)
    producer_regs: int = 40
    consumer_regs: int = 232
    widen_batch: int = 4  # v19: items a widener thread loads before it widens them
    # v19's widened B buffers: 2 (the wideners at most one block ahead of the consumers), or 3 (two ahead, one stage
    # fewer: v23; v24, the prefill pick since session 43, on it)
    widen_buffers: int = 2
    # v24 (the prefill pick since session 43): a widener warp hands a widened tile over with one arrive (after a warp
    # sync), not 32: the consumers sleeping on its full barrier were woken by each arrive (ncu on v23: ~19 retries)
    warp_handover: bool = False
    # phase stamps (benchmarks/moe_phases.py; variant `cutedsl:stamps`): v5's CTAs write globaltimer stamps (STAMPS)
    # where the split workspace goes (no split: the layer passes layer.stamp_workspace there): L1's CTAs at slot
    # bidx · STAMP_SLOTS, L2's STAMP_CTAS · STAMP_SLOTS further, so one layer call keeps both kernels' timelines
    stamps: bool = False
    # v27 (the decode rule; `cutedsl:v16` without): the row frame's column scales, the same in every K block, read
    # from K block 0 at every stage (the ring's bytes unchanged): one 1 KB DRAM read a unit, not one a stage (v8-v26
    # read a stage's own: ~5.6% of a decode stage's bytes, each 1 KB from its own DRAM page)
    row_scale_once: bool = False
    # v29 (the decode rule's L1s since session 49, layer.compile_layer's early_reads; `cutedsl:v27` without): v5's L1
    # reads its tile's route weights at the unit's start, under the K loop, not in the epilogue, where the global read
    # was a round trip a unit (Flash T = 64, ~24 units a CTA: 673.8 -> 658.3 us with v29's other early reads)
    route_first: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, got {self.epilogue!r}")
        if self.skip_padding_wave and not (self.row_frame and self.layout == "contiguous" and self.bm == 128):
            raise ValueError("skip_padding_wave is a mode of v3 (row_frame) on the contiguous layout")
        if self.fast_silu and not self.split_wg:
            raise ValueError("fast_silu is a mode of the split_wg kernel (v3)")
        if self.row_frame and not (self.split_wg or self.swap_ab):
            raise ValueError("row_frame is a mode of the split_wg (v3) and swap_ab (v5) kernels")
        if self.rs_codes and not (self.split_wg and not self.tiled_b):
            raise ValueError("rs_codes is a mode of the split_wg kernel (v3), which then reads no other tiles")
        if self.widen_wg and not (self.split_wg and self.row_frame and self.rs_codes and self.bm == 128
                                  and self.split_k == 1 and self.ablate in ("", "no-widen", "half-widen")):
            raise ValueError("widen_wg (v19) is a mode of v7 (split_wg, row_frame, rs_codes, bm 128), no split; of the "
                             "knock-outs no-widen and half-widen only")
        if self.ablate == "half-widen" and not self.widen_wg:
            raise ValueError("half-widen is a knock-out of v19's wideners (widen_wg) only")
        if self.warp_handover and not self.widen_wg:
            raise ValueError("warp_handover (v24) is a mode of v19 / v23 (widen_wg)")
        if self.widen_buffers not in (2, 3) or self.widen_buffers != 2 and not self.widen_wg:
            raise ValueError(f"widen_buffers is 2, or 3 with widen_wg (v19), got {self.widen_buffers}")
        if self.producer_regs + 2 * self.consumer_regs > 3 * self.launch_regs or \
                (self.producer_regs, self.consumer_regs) != (40, 232) and not self.widen_wg:
            raise ValueError(f"the register split is v19's knob (widen_wg), at most {3 * self.launch_regs} registers "
                             "over the three warpgroups (the launch's allocation)")
        if self.ablate not in ABLATIONS:
            raise ValueError(f"ablate must be one of {ABLATIONS}, got {self.ablate!r}")
        if self.early_weights and not ((self.swap_ab or self.split_wg) and self.pdl and self.epilogue == "bf16"):
            raise ValueError("early_weights is v5's or v3's L2 (swap_ab / split_wg, bf16 epilogue) under PDL only")
        if self.ablate in ("no-mma", "stream") and not self.swap_ab:
            raise ValueError(f"ablate={self.ablate!r} is a knock-out of v5 (swap_ab) only")
        one_wave_v3 = self.split_wg and self.bm == 64 and self.layout == "masked"
        if not 1 <= self.split_k <= MAX_SPLIT or (self.split_k > 1 and not (self.swap_ab or one_wave_v3)):
            raise ValueError(f"split_k must be 1 (or up to {MAX_SPLIT} on swap_ab, v5, or v3's masked 64-row tile), "
                             f"got {self.split_k}")
        if self.swap_ab:
            if self.layout != "masked" or self.split_wg or self.tiled_b:
                raise ValueError("swap_ab (v5) is a masked-layout kernel of its own: no split_wg or tiled_b")
            if self.bm not in SWAP_BM:
                raise ValueError(f"swap_ab takes bm (tokens a tile) in {SWAP_BM}, got {self.bm}")
        elif self.bm not in (64, 128):
            raise ValueError(f"bm must be 64 or 128, got {self.bm}")
        if self.layout == "contiguous" and self.bm != TILE_M:  # the work list needs whole segments per tile
            raise ValueError(f"the contiguous layout takes bm = {TILE_M} (its segment alignment), got {self.bm}")
        if self.row_scale_once and not self.row_frame:
            raise ValueError("row_scale_once is a mode of the row frame (row_frame): the block frame's scales differ")
        if self.route_first and not (self.swap_ab and self.epilogue == "swiglu"):
            raise ValueError("route_first is a mode of v5's L1 (swap_ab, swiglu epilogue)")
        if self.stamps and self.split_k != 1:
            raise ValueError("stamps take the split workspace: no split_k")
        if self.n_stages < 2:
            raise ValueError(f"bm={self.bm} leaves room for {self.n_stages} stage(s)")

    bn = BN
    n_mma_wg = 2
    threads = 384

    @property
    def launch_regs(self) -> int:
        """Registers a thread at launch (one CTA an SM; allocated in 8s): the pool setmaxnreg redistributes (168)."""
        return REGISTER_FILE // self.threads // 8 * 8

    @property
    def skips_widen(self) -> bool:
        """A knock-out that leaves the FP4 codes unwidened."""
        return self.ablate in ("no-widen", "stream")

    @property
    def skips_mma(self) -> bool:
        """A knock-out that issues no wgmma (v5: the fragments go to a sink instead)."""
        return self.ablate in ("no-mma", "stream")

    @property
    def waves(self) -> int:
        return self.bm // 64

    @property
    def x_rows(self) -> int:
        """Rows of x's TMA box: a 64-row wave (swap_ab: the bm-token tile)."""
        return self.bm if self.swap_ab else 64

    @property
    def a_boxes(self) -> int:
        """TMA boxes of x a stage: one per 64-row wave (swap_ab: one bm-row tile)."""
        return 1 if self.swap_ab else self.waves

    @property
    def codes(self) -> str:
        """The order the GEMMs read the weight codes in (CODES): the checkpoint's, tiled_b's load-time tiles
        (kernels/moe/layer.tiled_codes), swap_ab's (and rs_codes') RS-ordered tiles (layer.rs_codes)."""
        return "rs" if self.swap_ab or self.rs_codes else "tiled" if self.tiled_b else "plain"

    @property
    def tiled_codes(self) -> bool:
        """The weight codes come in load-time tiles (one contiguous tile a stage)."""
        return self.codes != "plain"

    @property
    def reduce_words(self) -> int:
        """The L1 epilogue's amax exchange in shared memory: per wave 64 rows x the two warpgroups (swap_ab: per
        token of the tile, one word per consumer warp)."""
        return 8 * self.bm if self.swap_ab else self.waves * 2 * 64

    @property
    def stage_bytes(self) -> int:
        """TMA bytes per stage: x tile (e4m3), packed FP4 weight tile, its shift bytes, its column
        scales, the x tile's row scales."""
        return self.bm * KBLOCK + self.bn * KBLOCK // 2 + 4 * self.bn + 4 * self.bn + 4 * self.bm

    @property
    def fixed_bytes(self) -> int:
        """The widened e4m3 B tiles (widen_buffers; none for swap_ab), the epilogue's amax exchange, the widening
        table, the work list, barriers."""
        widened = 0 if self.swap_ab else self.widen_buffers * self.bn * KBLOCK
        return widened + self.reduce_words * 4 + WIDEN_TABLE_WORDS * 4 + 2 * MAX_GROUPS * 4 + 2048

    @property
    def n_stages(self) -> int:
        if self.stages:
            return self.stages
        return min(MAX_STAGES, (SMEM_BYTES - self.fixed_bytes) // self.stage_bytes)


# The kernel versions as GroupedConfig overrides (the declared variants `cutedsl:v2` / `v3` / `v4` and the v2
# A/Bs name them, kernels/moe/family.py): v2 is kernels/moe/grouped_sm90.py on block-frame weights, v4 the same
# with the idle warps' promotion skipped, v3 kernels/moe/grouped_split.py (decoupled warpgroups) on row-frame
# weights with L1's cheaper epilogue.
# v19's, v23's and v24's knobs off (the rule's prefill pick has them on): every earlier version's dict carries them
NO_WIDENERS = {"widen_wg": False, "producer_regs": 40, "consumer_regs": 232, "widen_batch": 4, "widen_buffers": 2,
               "warp_handover": False}
V2 = {"split_wg": False, "row_frame": False, "fast_silu": False, "skip_idle_warps": False, "swap_ab": False,
      "skip_padding_wave": False, "rs_codes": False, "split_k": 1, **NO_WIDENERS}
V4 = {**V2, "skip_idle_warps": True}  # the decode pick before v5
V3 = {"split_wg": True, "row_frame": True, "fast_silu": True, "swap_ab": False, "skip_padding_wave": False,
      "rs_codes": False, "split_k": 1, **NO_WIDENERS}
V7 = {**V3, "skip_padding_wave": True}  # the prefill pick before v8: v3 without a tile's all-padding second wave
V5 = {**V2, "swap_ab": True}  # the decode pick before v8 (bm 16; layer.compile_layer adds bm 32 and v4 beside it)
# v8, the rule since session 33: one weight frame (row) and one copy of the codes (v5's RS-ordered tiles) for every
# GEMM of the layer: v5 on row-frame weights at decode, v3 on the RS tiles past WIDE_M, v7 on them at prefill
V8_DECODE = {**V5, "row_frame": True}
V8_WIDE = {**V3, "rs_codes": True}
# v27 (the decode rule since session 48): v8's decode GEMMs reading the row frame's column scales once a unit
# (row_scale_once; the wide pair follows the v5 pair's choice, layer.compile_layer); `cutedsl:v16` is the decode rule
# before it. Prefill keeps reading a stage's own (capped T = 4096: 0.988 / 1.020x, noise either way; lesson 23)
V27_DECODE = {**V8_DECODE, "row_scale_once": True}
V8_PREFILL = {**V7, "rs_codes": True}
# v19 (the prefill pick since session 41): v8's with the widening by the producer warpgroup's warps, their registers
# 72 (each thread loading 8 items ahead), the consumers' 216 (at 40 / 232 / 4 items: 1.03-1.05x slower than v7; at
# 72 / 216 / 8 1.02-1.06x faster); `cutedsl:v8-prefill` is V8_PREFILL
V19 = {**V8_PREFILL, "widen_wg": True, "producer_regs": 72, "consumer_regs": 216, "widen_batch": 8}
# v23 (the prefill pick in session 42; measured as candidate `cutedsl:v19-b3`): v19 with three widened B buffers,
# the wideners two blocks ahead of the consumers (ncu on v19: ~0.5 retries a block on a free buffer's barrier);
# `cutedsl:v19` is V19
V23 = {**V19, "widen_buffers": 3}
# v24 (the prefill pick since session 43): v23 with the wideners' hand-over one arrive a warp (ncu on v23: the consumers
# sleeping on a widened tile's full barrier were woken by each of its 96 arrives); `cutedsl:v23` is V23
V24 = {**V23, "warp_handover": True}


def choose(layout: str, epilogue: str) -> GroupedConfig:
    """v8: every GEMM of the layer on row-frame weights (expert_weights.prepare(frame="row")) and v5's RS-ordered code
    tiles (layer.rs_codes), so a model holds one frame and one copy of the codes. Decode (masked) takes v5 (swap-AB,
    the weights widened in registers as an RS wgmma's A; kernels/moe/grouped_rs.py) at 16 tokens a tile, launched
    with programmatic dependent launch; layer.compile_layer compiles 32 and v3 (V8_WIDE) beside it and a call takes
    the smallest v5 tile holding its largest count, v3 past WIDE_M or past a mean of WIDE_MEAN. Prefill (contiguous,
    128-row segments): v7 (v3 skipping a tile's all-padding second wave). H200, one process (docs/perf/moe.md "v8"):
    v5 on the row frame 1.00-1.06x v5 on the block frame (Pro T = 64 sparse 216.9 -> 204.9 us), v3 past 64 1.17x v4
    (Pro T = 256), v7 on the RS tiles 0.99-1.02x v7 on the plain codes. `cutedsl:v5` / `cutedsl:v7` keep v5 (v4 past
    64) on the block frame and v7 on the plain codes; `cutedsl:v2` / `cutedsl:v3` / `cutedsl:v4` the earlier kernels,
    for A/Bs. v9 (session 34) keeps these picks; the RS tiles' sign layout (expert_weights.rs_sign_layout) makes their
    widening 7 ops a word, and one token runs v5 too (no GEMV path). v10 (session 35) keeps them too: its changes
    are in the kernels' ring state (GroupedSm90._stage), work list and the masked dispatch. v11 (session 36):
    layer.compile_layer adds the 16-token tile's tail-split build (split_k MAX_SPLIT), which a call launches where
    its units' tail would be cut (grouped_slices.tail_slices: Pro T = 1). Prefill since session 42: v23 (V23, v8's
    pick widened by the producer warpgroup's warps into three B buffers); since session 43 v24 (V24: one hand-over
    arrive a widener warp; docs/perf/moe.md "v24-v26"). Decode since session 48: v27 (V27_DECODE)."""
    if layout == "masked":
        return GroupedConfig(layout=layout, epilogue=epilogue, bm=SWAP_BM[0], pdl=True, **V27_DECODE)
    return GroupedConfig(layout=layout, epilogue=epilogue, bm=128, **V24)
