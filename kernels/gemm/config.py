"""The tile rule: which GemmConfig runs a problem (M, N, K) on an SM90 part with `sms` SMs.

A small cost model, not a table of measurements: every candidate (bm, bn, split_k) is scored by
the time its busiest CTA needs, and the cheapest wins (ties: the larger tile, then fewer slices).

    units       = ceil(M / bm) * ceil(N / bn) * split_k        (work units, dealt round-robin)
    rounds      = ceil(units / sms)                             (units of the busiest CTA)
    active      = min(units, sms)                               (CTAs pulling at one time)
    per K block = max(tensor core: 2 * bm * bn * 128 / FP8_FLOPS_PER_CLK,
                      L2 -> SM:    (bm + bn) * 128 / L2_BYTES_PER_CLK,
                      DRAM:        bn * 128 / min(pull(bm, bn), DRAM_BYTES_PER_CLK / sms)
                                   (only when W is read once: one M tile))
    pull(bm, bn) = stages(bm, bn) * bn * 128 / DRAM_LATENCY_CLK   (one CTA's weight bytes in flight)
    cost        = rounds * (K blocks per slice * per K block + UNIT_CLK
                            (+ bm * bn * 4 / SPLIT_BYTES_PER_CLK when split: the fp32 partial's fix-up))
    clustered split (M <= bm <= 64, v10): per K block + CLUSTER_KB_CLK, fix-up CLUSTER_SLOT_CLK * (slices - 1),
                  at most MAX_CLUSTER_SPLIT slices and only as many clusters as stay resident

Prefill (large M) is bound by the tensor core and the L2 in the model: it prefers bm = 256 (two
waves of 128 rows, 3/4 of the L2 bytes per flop of 128 x 128) whenever the tiles fill the SMs, and
falls back to 128 x 128 when they do not (a few wide tiles leave SMs idle, or round up badly:
pro.wq_a at M = 4096 has 192 tiles of 256 x 128, 1.45 waves, but 384 of 128 x 128, 2.9 waves).
Between them (M 65-256) 64- and 128-row tiles, full rings, split-K only as `splits_k` allows (measured);
past 256 rows 64-, 128- and 256-row tiles (pairs from four M tiles), split-K as at M 65-128 (`row_tiles`).
Decode (M <= 64) is bound by
the weight stream from DRAM: the smallest x tile holding M (16, 32 or 64 rows) and the (bn, split_k)
that streams the weight fastest. One CTA
pulls what its ring keeps in flight per DRAM round trip (Little's law: its stages' weight bytes over
DRAM_LATENCY_CLK), so a wide tile pulls more per CTA and N fills the chip's bandwidth from fewer
CTAs; fewer tiles than that take split-K, whose fix-up (red.global.add of a bm x bn fp32 partial per
unit) is charged by its bytes, and at least MIN_KB_PER_SLICE K blocks per slice so that each
slice's pipeline fills. Since v8 (16 / 32-row x tiles and chained K blocks at decode) a CTA streams
at most its SM's share of the chip's weight stream (DRAM_BYTES_PER_CLK / sms), however few CTAs
pull: fewer, wider CTAs measured slower than the Little's-law pull promised (pro.shared_w2 at M 8:
56 CTAs of 16 x 128, 12.2 us, against 112 of 64 x 64, 10.8). Refit on run gemm/2026-11-27-h100-161f842-chains
(in git history at fb4f5cb; 17 layers x M 1 / 8 / 64 x 4 chained configurations): ranking each
shape's measured configurations by this model picks one within 0.9% of the fastest (geomean; with
the v5 constants, no cap: 2.7%); the cap binds before the pull for every ring the rule builds, so
decode picks the (bn, split_k) that deals the weight most evenly over the SMs, net of the fix-up.
Split-K takes only slices that keep one round (tiles x slices <= sms), and bn = 32 is a candidate
everywhere (before v8 only where bn = 64 left fewer than 32 tiles: with chained K blocks, 128 CTAs of
16 x 32 stream flash.wo_b / shared_w13 7-10% faster than 64 x 64 in two slices).

Constants (H100 SXM, per clock at 1.83 GHz): 8192 dense e4m3 flops per SM (1979 TFLOP/s); 55 B
per SM from L2 when every SM pulls (fitted: 128 x 128 tiles cost 1.16x the time per flop of 256 x
128 where both fill the SMs, the bm128 variant against the rule on all 17 layers at M = 4096, run
gemm/2026-11-25-h100-8023067-prefill-knockouts, in git history at 2bdde1c; DeepGEMM's model says ~46). The DRAM and
fix-up constants are fitted to the decode weight streams measured on the H100 at v3 (run
gemm/2026-11-25-h100-833ceaa-decode-variants, in git history at 2bdde1c; M = 64, all 17 layers, docs/perf/gemm.md): ours and
DeepGEMM alike stream the large weights at ~2.3 TB/s in all (1257 B/clock; the 1 GiB copy reaches
3.0). The per-CTA pull (DRAM_LATENCY_CLK; the fix-up rate kept) is refitted (v5) to the
decode study of all 17 layers x M 1 / 8 / 64 x 8 configurations (run
gemm/2026-11-26-h100-6fef4c4-decode-split-variants) (in git history at e18977f): ranking the measured configurations of each
shape by this model picks one within 0.6% of the fastest (geomean; the v4 constants: 2.3%).
UNIT_CLK is a unit's fixed cost (pipeline fill, epilogue).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from kernels.gemm.tiling import KBLOCK, GemmConfig, straddles_groups

H100_SMS = 132
FP8_FLOPS_PER_CLK = 8192
L2_BYTES_PER_CLK = 55.0
DRAM_BYTES_PER_CLK = 1257.0  # the whole chip's weight stream
DRAM_LATENCY_CLK = 6000  # one CTA's pull = its ring's weight bytes in flight / this (loaded latency)
SPLIT_BYTES_PER_CLK = 8.6  # split-K fix-up, fp32 partial bytes per clock per CTA
UNIT_CLK = 600
MIN_KB_PER_SLICE = 4
MAX_SPLIT = 16
BN = (192, 128, 64, 32)
PAIR_MIN_M_TILES = 4
CHAIN = 8
# decode (M <= 64) tiles of bn <= 64: the ring holds at most this much weight, not as many stages as
# fit (13-32). Deeper rings ran 2-8% slower on the large decode weights (H100, one process, M 1 / 64,
# docs/perf/gemm.md v9; lessons/gemm.md 15); bn 128's rings (8-11 stages) were level with 4-6.
DECODE_RING_BYTES = 64 * 1024
# split-K of tiles up to 64 rows runs as clusters of its slices merging in shared memory
# (GemmConfig.cluster_k): clusters of S CTAs that an H100 keeps resident at once (1 CTA an SM;
# cudaOccupancyMaxActiveClusters on the lent H100 SXM, benchmarks/cluster_occupancy.cu, run
# gemm/2026-11-27-h100-d81c9f5-cluster-split (in git history at ab46290):
# S 8 takes 15, so 16 clusters of 8 ran a second wave, 1.1x slower than the global fix-up). The
# merge costs the first slice a wait and a read per other slice: CLUSTER_SLOT_CLK each (fitted to
# that run's 2-8-slice variants on the four split layers at M 1 / 8 / 64)
CLUSTERS_RESIDENT = {2: 66, 3: 39, 4: 30, 5: 22, 6: 17, 7: 15, 8: 15}
CLUSTER_SLOT_CLK = 300
# and each K block of a clustered slice CLUSTER_KB_CLK over the stream's share (fewer, wider slices won:
# 64 x 4 beat 32 x 2 at pro.wq_a by 7-9%); any of 150-600 / 100-400 picks within 0.3% of the fastest
# measured form on all 12 shapes. Clusters of more than 4 slices ran slower even where resident (bn 64,
# 8 slices: 8% over 4)
CLUSTER_KB_CLK = 200
MAX_CLUSTER_SPLIT = 4
# M 129-256 (serving batches, chunked prefill): 64- and 128-row tiles, one K slice. H100, graph-timed, one process
# (run gemm/2026-11-27-h100-9894e1b-m256-bm64, in git history at a4535c5): at M 256 the rule's earlier picks
# (128 / 256-row tiles, split-K in global memory up to 8 slices) ran at 0.93x DeepGEMM; 64-row tiles in one slice,
# DeepGEMM's own pick there, won where they fill the SMs in one round (flash.wo_b 26.5 -> 20.1 us, pro.wq_a 17.2 ->
# 13.4), and every split form lost to a one-slice form (a slice's fp32 partial is bm x bn rows however few SMs idle);
# their rings were full (no DECODE_RING_BYTES cap). At M 192 64 x 192 tiles beat the 128 x 128 the model ties them
# with (half its second tile is padding; run ...-9c86000-m192-bn192, in git history at a4535c5). The rule:
# ...-1115245-m129-256 (in git history at 84d1a20).
SMALL_M = range(129, 257)
# M 65-128 (two 64-row tiles or one of 128): the rings full, as at SMALL_M, and split-K (merged in global memory)
# only where even 64 x 32 tiles fill under 1 / SPLIT_FILL of the SMs. H100, graph-timed, one process (an M 128 probe,
# docs/perf/gemm.md "v12"): one-slice forms beat the split picks wherever their tiles filled a
# quarter of the SMs (flash.wo_b 22.2 -> 18.6 us, pro.wq_a 14.8 -> 13.5) and full rings the 64 KB cap
# (flash.shared_w13 13.6 -> 12.8); pro.wkv's 32 tiles of 64 x 32 kept the split (10.9 against 13.0 in one slice).
# The rule: run gemm/2026-11-27-h100-2ef64b3-m65-128.
SPLIT_FILL = 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_tiles(m: int, min_rows: int = 16) -> tuple[int, ...]:
    """The CTA heights that suit M: the smallest x tile of 16, 32 or 64 rows (at least min_rows)
    holding M for decode, 64 / 128 up to 256 rows (SMALL_M; 64 first: a complete tie in `_cheapest` goes to
    the chained 64-row tile), 256 / 128 / 64 beyond. 64-row tiles past 256 rows, with split-K under SPLIT_FILL
    (`splits_k`) and bn 192 beside unpaired 256-row tiles (`choose_config`), since the H200 runs
    gemm/2026-11-28-h200-4941106-m300-forms and -m1000-forms (graph-timed, one process each, M 300 / 600 / 1000,
    all 17 layers x five forms): 64-row tiles in one slice beat the split 128-row tiles on the four narrow layers
    (flash.wq_a at M 300 13.6 -> 10.1 us, pro.wkv 14.1 -> 13.1), and 128 x 192 the unpaired 256 x 128 on 11 of 11
    shapes at M 300 / 600 (pro.wo_b at M 300 127.1 -> 73.7 us, flash.wo_b at M 600 49.2 -> 39.9)."""
    if m <= 64:
        return (next(r for r in (16, 32, 64) if r >= max(m, min_rows)),)
    return (64, 128) if m <= SMALL_M[-1] else (256, 128, 64)


def clustered(m: int, bm: int, split: int) -> bool:
    """Whether the rule runs a split as clusters merging in shared memory: decode, one M tile of up to 64
    rows (a bm x bn fp32 partial per slice fits beside the ring; the regime the cluster A/B measured).
    Taller or several M tiles (M > 64) merge in global memory, as v9 did."""
    return split > 1 and m <= bm <= 64


def cost(m: int, n: int, k: int, bm: int, bn: int, split: int, sms: int = H100_SMS,
         weight_stream: bool = True) -> float:
    """Modelled clocks of the busiest CTA (see the module docstring); weight_stream False: without the
    per-CTA DRAM term (`one_m_tile` sets a chip-wide floor instead)."""
    kb = k // KBLOCK
    tiles_m = _cdiv(m, bm)
    units = tiles_m * _cdiv(n, bn) * split
    dram = min(cta_pull(bm, bn), DRAM_BYTES_PER_CLK / sms)
    per_kb = max(2 * bm * bn * KBLOCK / FP8_FLOPS_PER_CLK, (bm + bn) * KBLOCK / L2_BYTES_PER_CLK,
                 bn * KBLOCK / dram if tiles_m == 1 and weight_stream else 0.0)
    fixup = 0.0
    if clustered(m, bm, split):
        fixup = CLUSTER_SLOT_CLK * (split - 1)
        per_kb += CLUSTER_KB_CLK
    elif split > 1:
        fixup = bm * bn * 4 / SPLIT_BYTES_PER_CLK
    return _cdiv(units, sms) * (_cdiv(kb, split) * per_kb + UNIT_CLK + fixup)


def clusters_fit(tiles: int, split: int, sms: int = H100_SMS) -> bool:
    """A clustered split's tiles (one cluster each) all resident at once, in at most MAX_CLUSTER_SPLIT slices."""
    return split <= MAX_CLUSTER_SPLIT and tiles <= CLUSTERS_RESIDENT[split] * sms // H100_SMS


@functools.lru_cache(maxsize=None)
def cta_pull(bm: int, bn: int) -> float:
    """Bytes per clock one CTA streams from DRAM: its ring's weight bytes in flight per round trip."""
    return ring_stages(bm, bn) * bn * KBLOCK / DRAM_LATENCY_CLK


def _fits(bm: int, bn: int, split: int) -> bool:
    """A clustered split's config leaves room for a ring of 4 stages beside its partials."""
    try:
        return GemmConfig(bm=bm, bn=bn, split_k=split, cluster_k=True).n_stages >= 4
    except ValueError:
        return False


def ring_stages(bm: int, bn: int, split: int = 1, cluster: bool = False) -> int:
    """The rule's ring depth: as many stages as fit (beside a clustered split's partials), but a decode
    tile of bn <= 64 holds at most DECODE_RING_BYTES of weight (still above the SM's share of the
    stream: the cap never binds cost())."""
    fit = GemmConfig(bm=bm, bn=bn, split_k=split, cluster_k=cluster).n_stages
    if bm <= 64 and bn <= 64:
        return min(fit, DECODE_RING_BYTES // (bn * KBLOCK))
    return fit


def splits_k(m: int, n: int, sms: int = H100_SMS) -> bool:
    """Whether split-K competes at this M (SMALL_M, SPLIT_FILL: at every M > 64 since `row_tiles`' M 300 / 600 run,
    where 64-row tiles in one slice beat 128-row tiles split in 2-5 slices on all four narrow layers)."""
    if m in SMALL_M:
        return False
    if m > 64:
        return _cdiv(m, 64) * _cdiv(n, min(BN)) * SPLIT_FILL < sms  # the most tiles any form has
    return True


def candidates(m: int, n: int, k: int, sms: int = H100_SMS, groups: int = 1, min_rows: int = 16):
    kb = k // KBLOCK
    may_split = splits_k(m, n, sms)
    for bm in row_tiles(m, min_rows):
        for bn in BN:
            # bn 192: one wave (bm <= 128), a grouped GEMM's tiles must not straddle groups; not at M <= 128,
            # where the weight stream binds and bn 128's deeper ring pulls more (H100: 4-13% slower at M 256,
            # where the model has no DRAM term), at M 129-256 (SMALL_M) 64 x 192 only (measured), past 256 rows
            # wherever the model prices it cheapest (`row_tiles`' M 300 / 600 run: 17 of its 18 picks there
            # within 3% of the fastest form timed; pro.shared_w13 at M 300 17% slower than 64 x 128 chained);
            # and only where 256-row tiles would not pair (`choose_config`)
            if bn == 192 and (bm == 256 or straddles_groups(bn, n, groups) or m < SMALL_M[0] or (
                    m in SMALL_M and bm != 64)):
                continue
            tiles = _cdiv(m, bm) * _cdiv(n, bn)
            splits = [1]
            # split-K only to fill idle SMs, one wave a tile, where this M allows it (`splits_k`)
            if bm <= 128 and tiles < sms and may_split:
                splits += [s for s in range(2, MAX_SPLIT + 1) if kb // s >= MIN_KB_PER_SLICE and tiles * s <= sms
                           and (not clustered(m, bm, s) or clusters_fit(tiles, s, sms) and _fits(bm, bn, s))]
            for s in splits:
                yield bm, bn, s


def _cheapest(m: int, n: int, k: int, sms: int, cands) -> tuple[int, int, int]:
    """Ties: at M 129-256 (SMALL_M) the fewer padded rows (M 192: three 64-row tiles, not two of 128), then the
    larger tile, then fewer slices. (pro.shared_w13 at M 193 / 224 / 256, H200, one process: 128 x 128 chained 26.45 /
    26.05 / 25.95 us, 64 x 192 27.82 / 27.57 / 27.26; run gemm/2026-11-28-h200-de2f74b-chains-128-w13.)"""
    def padded(bm: int) -> int:
        return _cdiv(m, bm) * bm - m if m in SMALL_M else 0
    return min(cands, key=lambda c: (math.floor(cost(m, n, k, *c, sms=sms)), padded(c[0]), -c[0] * c[1], c[2]))


def one_m_tile(m: int, n: int, k: int, bm: int, bn: int, sms: int = H100_SMS, groups: int = 1) -> bool:
    """M 129-256 (SMALL_M): whether 256 x 128 tiles (one M tile: each weight tile read once, two waves sharing it)
    replace the pick's bm x bn. Only where the pick already computes 256 rows (no more padded rows), and where the
    model prices them no dearer with the weight's DRAM stream a floor common to both (its bytes at the chip's
    rate; `cost` charges that stream per CTA, and only to one M tile): the floor binds both at the widest layers,
    and there two waves on one weight tile need fewer L2 bytes per flop than two 128-row tiles."""
    if m not in SMALL_M or _cdiv(m, bm) * bm < 256 or straddles_groups(128, n, groups):
        return False
    floor = n * k / DRAM_BYTES_PER_CLK

    def key(bm_: int, bn_: int) -> tuple[int, int]:
        c = cost(m, n, k, bm_, bn_, 1, sms, weight_stream=False)
        return math.floor(max(floor, c)), math.floor(c)
    return key(256, 128) <= key(bm, bn)


def pairs(m: int, n: int, bm: int, bn: int, groups: int = 1) -> bool:
    """Whether bm x bn tiles run as CTA pairs multicasting x (`choose_config`): 256 rows, x re-read by at least
    PAIR_MIN_M_TILES M tiles, and a pair's two N tiles inside one weight group."""
    return bm == 256 and _cdiv(m, bm) >= PAIR_MIN_M_TILES and (groups == 1 or (n // groups) % (2 * bn) == 0)


@functools.lru_cache(maxsize=4096)  # on every call's host path: a dict lookup, not a 40 us search
def choose_config(m: int, n: int, k: int, sms: int = H100_SMS, groups: int = 1, min_rows: int = 16) -> GemmConfig:
    """min_rows 64: the v7 rule, before the 16 / 32-row decode x tiles (variant `cutedsl:x64`)."""
    cands = list(candidates(m, n, k, sms, groups, min_rows))
    best = _cheapest(m, n, k, sms, [c for c in cands if c[1] != 192])
    # bn 192 competes only where 256-row pairs do not win: the model prices 128 x 192 and 256 x 128
    # pairs alike per output, and the pairs were 2-5% faster on the four M 16384 layers where it
    # picked 128 x 192 (H100, one process); against 128 x 128 it won 9% (pro.wq_a at M 4096). Unpaired (fewer than
    # PAIR_MIN_M_TILES M tiles) 256 x 128 meets bn 192 in the model (`row_tiles`' run); where it still wins, at M 400
    # (two M tiles, 7 layers), it ran 2-33% faster than the 128-row tiles (pro.wo_b 128.5 -> 96.7 us; run
    # gemm/2026-11-28-h200-396131e-m400)
    if not pairs(m, n, *best[:2], groups):
        best = _cheapest(m, n, k, sms, cands)
    bm, bn, split = best
    # one_m_tile, H200, graph-timed, one process (run gemm/2026-11-28-h200-6ba31c6-m129-256-one-tile, in git
    # history at c70e947): 256 x 128, DeepGEMM's own pick there, against the rule's: pro.wo_a 34.5 -> 31.6 us at
    # M 256 (DeepGEMM 31.5), 34.8 -> 29.9 at M 129; flash.wq_b 23.7 -> 21.9, pro.wq_b 54.0 -> 48.7 at M 256; at
    # M 129 the wq_b layers' 64 x 192 tiles (192 rows, not 256) stayed 4-15% faster
    if one_m_tile(m, n, k, bm, bn, sms, groups):  # SMALL_M only, where nothing splits (splits_k)
        bm, bn = 256, 128
    # bm 256 runs as CTA pairs multicasting x where x is re-read by several M tiles, the L2-bound
    # case: 5% faster over the prefill layers at M 4096 / 16384 (run gemm/2026-11-26-h100-bf91fba-x2, in git
    # history at e18977f).
    # With few M tiles the weight's DRAM stream binds and a pair would only couple two CTAs' streams
    # (not measured: the rule takes bm 128 up to M = 256). The cost model does not price the pair.
    pair = pairs(m, n, bm, bn, groups)
    # where the tile can (GemmConfig.chainable: one wave), K blocks in chains of 8: v8 (one consumer warpgroup)
    # 3-5% faster at M 1 / 8 / 64 than unchained, 1-3% than chains of 2 / 4; v14 (128-row tiles, two warpgroups
    # each with two temporaries), H200, graph-timed, one process: 1.045x DeepGEMM over every layer at M 192 / 256
    # against the unchained loop's 0.974x (Flash wo_a M 256 0.928 -> 0.987x), the N 512 layers at M 4096 7% faster
    # (runs gemm/2026-11-28-h200-de2f74b-chains-128, -wkv)
    cfg = GemmConfig(bm=bm, bn=bn, split_k=split, cluster_n=2 if pair else 1, cluster_k=clustered(m, bm, split),
                     x_box=box_rows(m, bm))
    stages = ring_stages(bm, bn, split, cfg.cluster_k)
    if stages < cfg.n_stages and m <= 64:  # the decode ring cap (M 65-128: SPLIT_FILL's run)
        cfg = replace(cfg, stages=stages)
    return replace(cfg, chain=CHAIN) if cfg.chainable else cfg


def box_rows(m: int, bm: int) -> int:
    """Rows of x's TMA box on a 16 / 32-row decode tile: M rounded up to 1, 2, 4 or 8 where that is fewer than bm
    (GemmConfig.x_box; 0: the tile's bm; sa's box max(4, x_box) rows). Rows of a box past M are zero-filled by TMA,
    and that costs: H200, graph-timed (runs gemm/2026-11-28-h200-5086dc2-xbox-r1 / -r2, -804281e-v16-m1 / -m1-4,
    in git history at 3d5b786; -a7fc8d7-v16-m1-8-r3 at b105ef9): M 4 3-8% faster on 9 of 17 layers (flash.shared_w13
    11.3 -> 10.4 us), M 1 1.219-1.243x DeepGEMM against 1.185-1.198x with 16-row boxes (three processes), M 8 level. x's box
    alone (sa's kept 16 rows) moved nothing (run -5fbd2d8-xbox-x-only: 1.002x)."""
    box = next((b for b in (1, 2, 4, 8) if m <= b), 0)
    return box if bm < 64 and box and box < bm else 0


# quant + gemm (the op a model calls) at decode: the GEMM launched with programmatic dependent launch, the quant
# kernel letting it start at once, its first ring-full of weights loaded before griddepcontrol.wait
# (GemmConfig.pdl). H100, graph-timed, one process (run gemm/2026-11-27-h100-ab46290-pdl, in git history at 2ef64b3):
# 1.086x / 1.102x the plain pair at M 1 / 64 over the 17 layers (0.6-2.1 us a call). Not measured past M 64: off there.
PDL_MAX_ROWS = 64


def choose_quant_gemm_config(m: int, n: int, k: int, sms: int = H100_SMS, groups: int = 1,
                             min_rows: int = 16) -> GemmConfig:
    """The GEMM's configuration in quant + gemm: the tile rule's, launched with PDL at decode (PDL_MAX_ROWS)."""
    cfg = choose_config(m, n, k, sms, groups, min_rows)
    return replace(cfg, pdl=True) if m <= PDL_MAX_ROWS else cfg

