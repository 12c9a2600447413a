"""gemm case space: every FP8 linear of DSV4 Flash and Pro (spec §1.3, §2.6, §11.2) at decode and
prefill token counts, plus hypothesis draws of ragged M / N / K (K a multiple of 128).

y[M, N] = x[M, K] . W[N, K]^T; the weight is [out, in] = [N, K]. The shared expert's w1 and w3 run
as one GEMM (their rows concatenated: N = 2 x moe_inter_dim). The grouped wo_a is not here (a
later grouped mode). Shapes shared by two layers appear once, named after both.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

# (model, layer, N = out, K = in)
LAYERS = [
    ("flash", "wq_a", 1024, 4096),
    ("flash", "wq_b", 32768, 1024),
    ("flash", "wkv", 512, 4096),
    ("flash", "wo_b", 4096, 8192),
    ("flash", "shared_w13+mtp_proj", 4096, 4096),
    ("flash", "shared_w2", 4096, 2048),
    ("flash", "indexer_wq_b", 8192, 1024),
    ("pro", "wq_a", 1536, 7168),
    ("pro", "wq_b", 65536, 1536),
    ("pro", "wkv", 512, 7168),
    ("pro", "wo_b", 7168, 16384),
    ("pro", "shared_w13", 6144, 7168),
    ("pro", "shared_w2", 7168, 3072),
    ("pro", "indexer_wq_b", 8192, 1536),
    ("pro", "mtp_proj", 7168, 7168),
]
DECODE_M = (1, 8, 64, 256)
PREFILL_M = (4096, 16384)
TOKENS = DECODE_M + PREFILL_M


def production() -> list[dict]:
    return [{"m": m, "n": n, "k": k, "layer": f"{model}.{layer}"}
            for model, layer, n, k in LAYERS for m in TOKENS]


def extra_strategy() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "m": tile_counts(64, 40),
        "n": tile_counts(64, 64).map(lambda v: max(8, v - v % 8)),  # 16-byte output rows
        "k": st.integers(1, 40).map(lambda b: 128 * b),
        "layer": st.just("drawn"),
    })


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
