"""RMSNorm case space: the widths DSV4 normalizes over, ragged row counts, hypothesis extras.

Where each width comes from (spec §1, §2.1, §3, §4, §5): 128 indexer-compressor norm; 512 kv_norm,
compressor norm and the per-head weightless q norm (rows = tokens x heads); 1024 / 1536 q_norm
(Flash / Pro); 4096 / 7168 attn/ffn/final norms; 16384 / 28672 the weightless mHC pre-norm over 4·D.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

# (width, weighted, where)
DSV4_WIDTHS = [
    (128, True, "indexer compressor norm"),
    (512, True, "kv_norm / compressor norm"),
    (512, False, "per-head q norm"),
    (1024, True, "q_norm Flash"),
    (1536, True, "q_norm Pro"),
    (4096, True, "attn/ffn/final norm Flash"),
    (7168, True, "attn/ffn/final norm Pro"),
    (16384, False, "mHC pre-norm Flash (4D)"),
    (28672, False, "mHC pre-norm Pro (4D)"),
]
DECODE_ROWS, PREFILL_ROWS, RAGGED_ROWS = 64, 4096, 1001
BENCH_SHAPES = [(16384, 7168), (16384, 4096), (65536, 512)]


def production() -> list[dict]:
    cases = [
        {"m": m, "n": n, "dtype": "bf16", "weight": weighted}
        for n, weighted, _where in DSV4_WIDTHS
        for m in (DECODE_ROWS, PREFILL_ROWS, RAGGED_ROWS)
    ]
    return cases + [{"m": m, "n": n, "dtype": "bf16", "weight": True} for m, n in BENCH_SHAPES]


def extra_strategy() -> st.SearchStrategy[dict]:
    width = st.one_of(
        st.sampled_from([8, 64, 256, 512, 1000, 2048, 3072, 4100, 7168, 8192]),
        st.integers(1, 1024).map(lambda k: 8 * k),
        st.integers(1, 4096),  # widths that are not a multiple of the 16-byte vector
    )
    return st.fixed_dictionaries({
        "m": tile_counts(4, 600),
        "n": width,
        "dtype": st.sampled_from(["bf16", "bf16", "fp16", "fp32"]),
        "weight": st.booleans(),
    })


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
