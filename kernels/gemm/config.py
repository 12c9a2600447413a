"""The tile rule: which GemmConfig runs a problem (M, N, K) on an SM90 part with `sms` SMs.

Work per CTA is a (bm x bn) output tile times K/128 promotion blocks.
* Prefill (M large, compute bound): bm = 128 (two consumer warpgroups, 64 rows each) and bn = 128:
  the largest tile whose fp32 accumulator plus promotion temporary (128 registers per thread) fits
  beside the epilogue without spills; bn must divide the 128-wide weight-scale block.
* Decode (M <= 64, weight-bandwidth bound): bm = 64 (one consumer warpgroup; rows past M are
  TMA zero fill and cost no DRAM traffic). Every SM must stream weight bytes, so when the tiles do
  not fill the SMs, bn drops to 64 and then K is split (split-K with an in-kernel fix-up by the last
  slice to finish), keeping at least `MIN_KB_PER_SLICE` K blocks per slice so that the pipeline
  fills.
"""

from __future__ import annotations

from kernels.gemm.gemm_sm90 import KBLOCK, GemmConfig

H100_SMS = 132
MIN_KB_PER_SLICE = 4
MAX_SPLIT = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_config(m: int, n: int, k: int, sms: int = H100_SMS) -> GemmConfig:
    kb = k // KBLOCK
    bm = 64 if m <= 64 else 128
    bn = 128
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    if tiles < sms:
        bn = 64
        tiles = _cdiv(m, bm) * _cdiv(n, bn)
    split = 1
    if tiles < sms and kb >= 2 * MIN_KB_PER_SLICE:
        split = max(1, min(MAX_SPLIT, _cdiv(sms, tiles), kb // MIN_KB_PER_SLICE))
    return GemmConfig(bm=bm, bn=bn, split_k=split)
