"""The tile rule of the indexer logits kernel: the compiled configuration of a problem, and the key
split (a runtime argument) that fills the SMs when there are few query blocks.

Configuration: bq = 2 tokens per query block (wgmma N = 128), two consumer warpgroups that take the
CTA's 64-key tiles in turn (tile_wgs = 1), each with two tiles in flight in chains of 2 (overlap =
2: the next tile's wgmmas run under this tile's epilogue), for every shape: SHIPPED. Measured on the
H100 (docs/perf/indexer.md, v2): the fastest of the schedules tried on the four prefill shapes in
three sweeps (1.10-1.14x DeepGEMM at S = 4096, 1.06-1.09x at 16384) and on every drawn ragged case;
  * the two warpgroups sharing each 128-key tile in lockstep (v1, `cutedsl:coop`) leave the tensor
    core idle during their epilogues: 0.93x DeepGEMM at 16384 with v2's epilogue, 0.71x with v1's;
  * four warpgroups of 112 registers (DeepGEMM's layout, `cutedsl:wg4*`) overlap by occupancy but
    hold one tile each: 0.95-1.02x; two tiles in flight need 2 x 64 accumulator registers, which
    only n_wg <= 2 has;
  * chains longer than 2 (`cutedsl:overlap3`, `overlap4`) were 1-2% slower (more code, the same
    exposure once a chain);
  * bq = 4 (`cutedsl:bq4`: half the keys' L2 traffic a flop) was 0.77-0.87x with v1's epilogue;
    with two tiles in flight it does not fit the registers (LogitsConfig refuses it).
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


SHIPPED = LogitsConfig(bq=2, n_wg=2, tile_wgs=1, overlap=2)


def choose_config(n_tok: int, s_kv: int) -> LogitsConfig:
    return SHIPPED


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


SELECT_MIN_WIDTH = 131072  # the fused decode top-k runs past this many entries a row ...
SELECT_MIN_REQUESTS = 8  # ... with at least this many requests; the unfused pair elsewhere


def fuse_select(n_req: int, width: int) -> bool:
    """Whether the decode top-k op runs the fused kernels (kernels/indexer/select_sm90.py) or the
    unfused pair (decode logits, then top-k). The fused path saves the pair's logits traffic (4 B a
    key of the 132 B it reads, most of it absorbed by the 50 MB L2 while B x W x 4 B fits there) and
    pays a fixed ~40 us (the sample and bound, the repair launch, the buffers' finish). Measured on the
    H100, k = 1024, harness timing, unfused / fused time (benchmarks/results/indexer, select rows):
        W = 262,144: B 1 0.49, 4 0.91, 8 1.00, 16 1.09, 32 1.05, 64 1.08, 128 1.01
        W = 131,072: B 1 0.41, 4 0.61, 8 0.83, 16 1.02, 32 1.00, 64 1.05, 128 0.99
        W =  65,536: B 4 0.43, 16 0.91, 32 0.92, 64 0.98, 128 0.95
    so the fused kernels run only where they won every time: W > 131,072 and B >= 8."""
    return width > SELECT_MIN_WIDTH and n_req >= SELECT_MIN_REQUESTS

