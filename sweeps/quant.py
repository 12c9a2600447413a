"""Activation-quantisation case space: every place DSV4 quantises an activation, plus hypothesis extras.

Where each shape comes from (spec §1.1, §2.3-§2.6, §5.5, §6, §8.3):
- fp8 / 128 (act_quant before every FP8/FP4 GEMM): D = 4096 / 7168 (wq_a, wkv, shared w1/w3,
  routed w1/w3); q_lora 1024 / 1536 (wq_b); moe_inter 2048 / 3072 (w2); G·o_lora 8192 / 16384 (wo_b).
- fp8 / 64 (KV-cache QAT): the 448 NoPE dims of a 512-wide kv row (a column slice, row stride 512).
- mxfp4 / 32 after Hadamard-128 (indexer): q rows = tokens × 64 heads; compressed keys rows = tokens / 4.
Rows: decode 64 tokens, prefill 4096 tokens, a ragged 1001, and one long 16384-token chunk.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

DECODE, PREFILL, RAGGED = 64, 4096, 1001
LONG_PREFILL = 16384  # a long prefill chunk: the steady-state bandwidth, call overhead amortised
INDEXER_HEADS = 64
FP8_GEMM_WIDTHS = (1024, 1536, 2048, 3072, 4096, 7168, 8192, 16384)
KV_NOPE, KV_ROW = 448, 512


def fp8(m: int, n: int, block: int = 128, stride: int | None = None) -> dict:
    return {"fmt": "fp8", "m": m, "n": n, "block": block, "rotate": False, "stride": stride or n}


def mxfp4(m: int, n: int = 128, rotate: bool = True) -> dict:
    return {"fmt": "mxfp4", "m": m, "n": n, "block": 32, "rotate": rotate, "stride": n}


def production() -> list[dict]:
    cases = [fp8(m, n) for n in FP8_GEMM_WIDTHS for m in (DECODE, PREFILL)]
    cases += [fp8(RAGGED, 7168), fp8(RAGGED, 1536), fp8(LONG_PREFILL, 7168)]
    cases += [fp8(m, KV_NOPE, 64, KV_ROW) for m in (DECODE, PREFILL, RAGGED)]
    cases += [mxfp4(t * INDEXER_HEADS) for t in (DECODE, PREFILL)]  # indexer q
    cases += [mxfp4(m) for m in (PREFILL // 4, RAGGED)]  # indexer compressed keys
    return cases


def extra_strategy() -> st.SearchStrategy[dict]:
    fp8_case = st.builds(
        lambda m, block, k, pad: fp8(m, block * k, block, block * k + pad),
        tile_counts(8, 300), st.sampled_from([64, 128]), st.integers(1, 64), st.sampled_from([0, 0, 8, 64]),
    )
    fp4_case = st.builds(lambda m, k: mxfp4(m, 32 * k, rotate=False), tile_counts(8, 300), st.integers(1, 128))
    rotated = st.builds(mxfp4, tile_counts(16, 300))
    return st.one_of(fp8_case, fp4_case, rotated)


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
