"""The tile rule of the indexer logits kernel: the compiled configuration of a problem, and the key
split (a runtime argument) that fills the SMs when there are few query blocks.

Configuration: bq = 2 tokens per query block (wgmma N = 128) and two consumer warpgroups (key tile
bk = 128), for every shape. Why (a budget, not a measurement; docs/perf/indexer.md):
  * per key tile a warpgroup's wgmma is 64 x 64*bq x 128 and its epilogue ~2 instructions per
    accumulator value (ReLU, x w: 32*bq per thread) plus ~10 per (row, token): bq = 2 needs ~170
    issue slots per warp against 256 tensor-core clocks of the other warpgroup's wgmma, so two
    warpgroups out of phase can keep the tensor core busy (the `cutedsl:pingpong` variant forces
    that; the shipped cooperative warpgroups share each stage and may fall into step);
  * every query block re-reads its keys from L2 (they fit: 132 B per key, 0.5 MB at S_kv = 4096),
    128 B per 2 * 64 * bq * 128 flops: at the full FP8 rate (8192 flops/clk/SM) bq = 2 pulls 32 B/clk
    per SM, within the ~55 B/clk an H100 SM gets from L2 when all pull (bq = 1: 64, over it; bq = 4:
    16);
  * bq = 4 doubles the accumulator (128 fp32 registers) and the weights (64) per thread; it compiles
    without spills, and is declared as a variant (`cutedsl:bq4`, `cutedsl:pingpong-bq4`) to measure.
Key split: a query block's key tiles are cut into n_split contiguous parts (work units) only when
the query blocks alone leave SMs idle, and never below MIN_TILES_PER_PART tiles per part (a part
reloads the block's queries, 16 KB, and pays the pipeline fill).
"""

from __future__ import annotations

import functools

from kernels.indexer.logits_sm90 import LogitsConfig

H100_SMS = 132
MIN_TILES_PER_PART = 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=1024)  # on the call path: a dict lookup
def choose_config(n_tok: int, s_kv: int) -> LogitsConfig:
    return LogitsConfig(bq=2, n_wg=2)


@functools.lru_cache(maxsize=4096)
def choose_split(n_tok: int, s_kv: int, cfg: LogitsConfig, sms: int = H100_SMS) -> int:
    """Key parts per query block: 1 when the blocks fill the SMs, else enough parts for about one
    unit per SM, each of at least MIN_TILES_PER_PART key tiles."""
    blocks = _cdiv(n_tok, cfg.bq)
    tiles = _cdiv(s_kv, cfg.bk)
    if blocks >= sms or tiles < 2 * MIN_TILES_PER_PART:
        return 1
    return max(1, min(_cdiv(sms, blocks), tiles // MIN_TILES_PER_PART))


DECODE_CTAS_PER_SM = 2  # the decode kernel's CTAs resident per SM (shared memory: 8 stages of one page)
DECODE_WAVES = 2  # CTAs per request chosen for about this many waves of uniform requests


@functools.lru_cache(maxsize=4096)
def choose_parts(n_req: int, max_pages: int, sms: int = H100_SMS) -> int:
    """Pages per CTA of the paged decode kernel (a runtime argument): B * ceil(max_pages / P) CTAs
    of about DECODE_WAVES waves, P equalised over a request's parts (at least 1 page)."""
    parts = max(1, min(max_pages, _cdiv(DECODE_WAVES * DECODE_CTAS_PER_SM * sms, n_req)))
    return _cdiv(max_pages, parts)
