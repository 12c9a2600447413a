"""gemm case space: every FP8 linear of DSV4 Flash and Pro (spec §1.3, §2.6, §7.4, §11.2) at decode
and prefill token counts, plus hypothesis draws of ragged M / N / K (K a multiple of 128).

y[M, N] = x[M, groups*K] . blockdiag(W)^T; the weight is [out, in] = [N, K]. The shared expert's w1
and w3 run as one GEMM (their rows concatenated: N = 2 x moe_inter_dim). The grouped output
projection wo_a (groups = o_groups) takes each group's 4096 attention features to its 1024 outputs
in one launch: x [T, G*4096], W [G*1024, 4096]. Shapes shared by two layers appear once, named
after both.

Every shape, production and drawn, is a case twice: the GEMM on pre-quantised operands (no `op`
parameter: the ids of results committed before the quant+gemm op existed still name them) and
`op = "quant+gemm"`, the call a model makes (bf16 activations in, their quantisation timed with
the GEMM; kernels/gemm/quant_gemm.py).
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

# (model, layer, N = out, K = in per group, groups)
LAYERS = [
    ("flash", "wq_a", 1024, 4096, 1),
    ("flash", "wq_b", 32768, 1024, 1),
    ("flash", "wkv", 512, 4096, 1),
    ("flash", "wo_a", 8192, 4096, 8),
    ("flash", "wo_b", 4096, 8192, 1),
    ("flash", "shared_w13+mtp_proj", 4096, 4096, 1),
    ("flash", "shared_w2", 4096, 2048, 1),
    ("flash", "indexer_wq_b", 8192, 1024, 1),
    ("pro", "wq_a", 1536, 7168, 1),
    ("pro", "wq_b", 65536, 1536, 1),
    ("pro", "wkv", 512, 7168, 1),
    ("pro", "wo_a", 16384, 4096, 16),
    ("pro", "wo_b", 7168, 16384, 1),
    ("pro", "shared_w13", 6144, 7168, 1),
    ("pro", "shared_w2", 7168, 3072, 1),
    ("pro", "indexer_wq_b", 8192, 1536, 1),
    ("pro", "mtp_proj", 7168, 7168, 1),
]
QUANT_GEMM = "quant+gemm"
DECODE_M = (1, 8, 64, 256)
PREFILL_M = (4096, 16384)
TOKENS = DECODE_M + PREFILL_M


def with_quant_gemm(cases: list[dict]) -> list[dict]:
    """The cases, then each of them as the quant+gemm op."""
    return cases + [{**c, "op": QUANT_GEMM} for c in cases]


def production() -> list[dict]:
    return with_quant_gemm([{"m": m, "n": n, "k": k, "groups": g, "layer": f"{model}.{layer}"}
                            for model, layer, n, k, g in LAYERS for m in TOKENS])


def _grouped(d: dict) -> dict:
    """A grouped draw: N becomes groups whole 128-row weight blocks per group."""
    g = d["groups"]
    return d if g == 1 else {**d, "n": g * 128 * max(1, d["n"] // (128 * g))}


def extra_strategy() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "m": tile_counts(64, 40),
        "n": tile_counts(64, 64).map(lambda v: max(8, v - v % 8)),  # 16-byte output rows
        "k": st.integers(1, 40).map(lambda b: 128 * b),
        "groups": st.sampled_from([1, 1, 1, 2, 3]),
        "layer": st.just("drawn"),
    }).map(_grouped)


def extra(n: int, seed: int) -> list[dict]:
    return with_quant_gemm(draw(extra_strategy(), n, seed))
