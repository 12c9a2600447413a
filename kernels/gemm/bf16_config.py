"""The bf16 GEMM's tile configuration (Bf16Config) and its tile rule (`choose_bf16_config`).

y[M, N] = x[M, K] . W[N, K]^T with x and W bf16 and fp32 accumulation (kernels/gemm/bf16_sm90.py):
the model's GEMMs on BF16 checkpoint weights (lm_head, the compressors' wkv / wgate, the indexer's
weights_proj), whose reference math is fp32 on bf16 values.

A K block is BK = 64 bf16 = 128 bytes of every row, exactly what one K block of the FP8 kernel
(128 e4m3) is, and a bf16 wgmma does half the flops per clock of an e4m3 one on half the K: so per
K block the tensor-core, L2 and DRAM terms of the FP8 cost model (kernels/gemm/config.py) are the
same expressions, and the rule reuses its H100 constants as they are (none refitted for bf16 yet):

    units       = ceil(M / bm) * ceil(N / bn) * split_k
    per K block = max(tensor core: 2 * bm * bn * 64 / (FP8_FLOPS_PER_CLK / 2),
                      L2 -> SM:    (bm + bn) * 128 / L2_BYTES_PER_CLK,
                      DRAM:        bn * 128 / min(pull, DRAM_BYTES_PER_CLK / active)   (one M tile))
    pull        = stages * bn * 128 / DRAM_LATENCY_CLK      (one CTA's weight bytes in flight)
    cost        = max(ceil(units / sms) * (K blocks per slice * per K block + UNIT_CLK (+ split fix-up)),
                      2 * (M + N) * K / DRAM_BYTES_PER_CLK)
    (the last term, which the FP8 model lacks, is the chip-wide floor of reading x and W once: with
    several M tiles the per-CTA DRAM term is dropped, as W is shared through L2.)

Candidates: bm 64 (one consumer warpgroup) for M <= 64, else 128 or 64 (two / one); bn 64, 128 or
256 (the wgmma n); split-K 2..16 only while the tiles leave SMs idle, at least MIN_KB_PER_SLICE K
blocks a slice. Ties: the larger tile, then fewer slices. What this picks: decode of the 1 GB
lm_head takes 64 x 256 tiles (505 tiles: every SM streams W; the DRAM term binds), prefill the
128 x 256 tiles that keep the tensor core ahead of L2 where they fill the SMs, and the small-N
decode GEMMs (compressors, weights_proj) split K until the SMs are busy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kernels.gemm.config import (
    DRAM_BYTES_PER_CLK, DRAM_LATENCY_CLK, FP8_FLOPS_PER_CLK, H100_SMS, L2_BYTES_PER_CLK, MAX_SPLIT,
    MIN_KB_PER_SLICE, SPLIT_BYTES_PER_CLK, UNIT_CLK,
)
from kernels.gemm.tiling import SMEM_BYTES

BK = 64  # K elements per stage: 128 bytes of a bf16 row, one 128-byte swizzle atom
MAX_STAGES = 16
BF16_FLOPS_PER_CLK = FP8_FLOPS_PER_CLK // 2  # dense bf16 wgmma per SM (989 TFLOP/s at 1.83 GHz)
FIXED_SMEM = 2048  # barriers, the split-K flag, alignment


@dataclass(frozen=True)
class Bf16Config:
    """Compile-time tile configuration of the bf16 GEMM."""

    bm: int = 128  # CTA rows: 64 (one consumer warpgroup) or 128 (two, 64 rows each)
    bn: int = 256  # CTA columns: 64, 128 or 256 (the wgmma n)
    stages: int = 0  # smem ring depth; 0 = as many as fit (at most MAX_STAGES)
    group_m: int = 8  # rasterisation: M-tiles per group (persistent_sm90.py's _tile_of)
    split_k: int = 1  # K slices per tile (decode: fill the SMs when M and N give too few tiles)
    group_n: int = 0  # grouped mode (wo_a): output columns per weight group, a multiple of bn; 0 = plain
    # the K-block loops (producer: persistent_sm90.py, consumers) unrolled by this factor (variants
    # `cutedsl:unroll2`, `cutedsl:unroll4`; the FP8 kernel's v7 took 4: docs/lessons/gemm.md 12)
    unroll: int = 1

    def __post_init__(self) -> None:
        if self.bm not in (64, 128):
            raise ValueError(f"bm must be 64 or 128, got {self.bm}")
        if self.bn not in (64, 128, 256):
            raise ValueError(f"bn must be 64, 128 or 256, got {self.bn}")
        if not 1 <= self.split_k <= MAX_SPLIT:
            raise ValueError(f"split_k must be 1..{MAX_SPLIT}, got {self.split_k}")
        if self.unroll not in (1, 2, 4):
            raise ValueError(f"unroll must be 1, 2 or 4, got {self.unroll}")
        if self.group_m < 1:
            raise ValueError("group_m must be >= 1")
        if self.group_n < 0 or self.group_n % self.bn:
            raise ValueError(f"group_n must be a multiple of bn {self.bn} (0: plain), got {self.group_n}")
        if self.stages and self.stages * self.stage_bytes + FIXED_SMEM > SMEM_BYTES:
            raise ValueError(f"{self.stages} stages of {self.stage_bytes} B do not fit shared memory")
        if self.n_stages < 2:
            raise ValueError(f"bm {self.bm} x bn {self.bn} leaves room for {self.n_stages} smem stage(s)")

    @property
    def cluster_k(self) -> bool:
        """Split-K clusters (GemmConfig.cluster_k) are the FP8 kernel's: the bf16 one merges in global memory."""
        return False

    @property
    def stamps(self) -> bool:
        """Phase stamps (GemmConfig.stamps) are the FP8 kernel's; glue.workspace asks every config."""
        return False

    @property
    def n_mma_wg(self) -> int:
        return self.bm // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.n_mma_wg)

    @property
    def stage_bytes(self) -> int:
        """Bytes TMA brings per stage (the x and W tiles of one K block; OOB rows count, zero-filled)."""
        return (self.bm + self.bn) * BK * 2

    @property
    def n_stages(self) -> int:
        if self.stages:
            return self.stages
        return min(MAX_STAGES, (SMEM_BYTES - FIXED_SMEM) // self.stage_bytes)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer, consumer)."""
        return (40, 232) if self.n_mma_wg == 2 else (40, 256)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cta_pull(bm: int, bn: int) -> float:
    """Bytes per clock one CTA streams from DRAM: its ring's weight bytes in flight per round trip."""
    return Bf16Config(bm=bm, bn=bn).n_stages * bn * BK * 2 / DRAM_LATENCY_CLK


def cost(m: int, n: int, k: int, bm: int, bn: int, split: int, sms: int = H100_SMS) -> float:
    """Modelled clocks of the busiest CTA (the module docstring)."""
    kb = _cdiv(k, BK)
    tiles_m = _cdiv(m, bm)
    units = tiles_m * _cdiv(n, bn) * split
    dram = min(cta_pull(bm, bn), DRAM_BYTES_PER_CLK / min(units, sms))
    per_kb = max(2 * bm * bn * BK / BF16_FLOPS_PER_CLK, (bm + bn) * BK * 2 / L2_BYTES_PER_CLK,
                 bn * BK * 2 / dram if tiles_m == 1 else 0.0)
    fixup = bm * bn * 4 / SPLIT_BYTES_PER_CLK if split > 1 else 0.0
    busiest = _cdiv(units, sms) * (_cdiv(kb, split) * per_kb + UNIT_CLK + fixup)
    return max(busiest, 2 * (m + n) * k / DRAM_BYTES_PER_CLK)  # x and W cross DRAM at least once


def candidates(m: int, n: int, k: int, sms: int = H100_SMS):
    kb = _cdiv(k, BK)
    for bm in ((64,) if m <= 64 else (128, 64)):
        for bn in (256, 128, 64):
            tiles = _cdiv(m, bm) * _cdiv(n, bn)
            splits = [1]
            if tiles < sms:  # split-K only to fill idle SMs
                splits += [s for s in range(2, MAX_SPLIT + 1) if kb // s >= MIN_KB_PER_SLICE]
            for s in splits:
                yield bm, bn, s


@functools.lru_cache(maxsize=4096)  # on every call's host path
def choose_bf16_config(m: int, n: int, k: int, sms: int = H100_SMS, groups: int = 1) -> Bf16Config:
    """The rule's tile for y [M, N] = x . W^T with K per group; grouped (wo_a): the N tiles must not
    straddle groups, so bn divides N / groups (the same cost model: a tile still reads one group's K)."""
    group_n = n // groups if groups > 1 else 0
    bm, bn, split = min((c for c in candidates(m, n, k, sms) if not group_n or group_n % c[1] == 0),
                        key=lambda c: (math.floor(cost(m, n, k, *c, sms=sms)), -c[0] * c[1], c[2]))
    return Bf16Config(bm=bm, bn=bn, split_k=split, group_n=group_n)
