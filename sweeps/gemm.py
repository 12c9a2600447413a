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

`op = "bf16"` is the bf16 GEMM (kernels/gemm/bf16_sm90.py): y fp32 [M, N] = x bf16 [M, K] . W bf16
[N, K]^T, the model's GEMMs on BF16 checkpoint weights (BF16_LAYERS) at M in BF16_M, plus draws of
ragged M / N / K (K a multiple of 8: TMA rows; not of the 64-wide K block). The compressors' wkv and
wgate run as one GEMM on their rows stacked (N = 2 x coff*d), as kernels/gemm/bf16_serves.py calls it.
Grouped bf16 (`groups` > 1): wo_a as the reference runs it (BF16_GROUPED: its einsum on the dequantised
FP8 weight), x [M, G*K], W [G*Ng, K], plus draws of 2-5 groups.
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
BF16 = "bf16"
# (model, layer, N, K): the bf16 GEMMs (spec §5.2, §6, §9.1); D = 4096 (Flash) / 7168 (Pro)
BF16_LAYERS = [
    (model, layer, n, d)
    for model, d in (("flash", 4096), ("pro", 7168))
    for layer, n in (("head", 129280), ("csa_compressor.wkv+wgate", 2048), ("hca_compressor.wkv+wgate", 1024),
                     ("indexer_compressor.wkv+wgate", 512), ("indexer.weights_proj", 64))
]
# (model, layer, N, K per group, groups): wo_a in bf16, the reference's einsum on the dequantised weight
BF16_GROUPED = [("flash", "wo_a", 8192, 4096, 8), ("pro", "wo_a", 16384, 4096, 16)]
BF16_M = (1, 8, 64, 256, 4096)
DECODE_M = (1, 8, 64, 256)
PREFILL_M = (4096, 16384)
TOKENS = DECODE_M + PREFILL_M


def with_quant_gemm(cases: list[dict]) -> list[dict]:
    """The cases, then each of them as the quant+gemm op."""
    return cases + [{**c, "op": QUANT_GEMM} for c in cases]


def production() -> list[dict]:
    return with_quant_gemm([{"m": m, "n": n, "k": k, "groups": g, "layer": f"{model}.{layer}"}
                            for model, layer, n, k, g in LAYERS for m in TOKENS]) + bf16_production()


def bf16_production() -> list[dict]:
    return ([{"m": m, "n": n, "k": k, "layer": f"{model}.{layer}", "op": BF16}
             for model, layer, n, k in BF16_LAYERS for m in BF16_M]
            + [{"m": m, "n": n, "k": k, "groups": g, "layer": f"{model}.{layer}", "op": BF16}
               for model, layer, n, k, g in BF16_GROUPED for m in BF16_M])


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


def bf16_strategy() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "m": tile_counts(64, 40),
        "n": tile_counts(64, 64),  # any N: the epilogue stores element by element
        "k": tile_counts(64, 40).map(lambda v: max(8, v - v % 8)),  # TMA: 16-byte rows
        "layer": st.just("drawn"),
        "op": st.just(BF16),
    })


def bf16_grouped_strategy() -> st.SearchStrategy[dict]:
    """Grouped bf16 draws: 2-5 groups of whole 64-column tiles, K whole 64-wide blocks."""
    return st.fixed_dictionaries({
        "m": tile_counts(64, 40),
        "groups": st.integers(2, 5),
        "tiles": st.integers(1, 6),
        "k": st.integers(1, 24).map(lambda b: 64 * b),
    }).map(lambda d: {"m": d["m"], "n": d["groups"] * 64 * d["tiles"], "k": d["k"], "groups": d["groups"],
                      "layer": "drawn", "op": BF16})


def extra(n: int, seed: int) -> list[dict]:
    # each kind draws from its own seed stream, so the draws of the kinds before it stay what they were
    return (with_quant_gemm(draw(extra_strategy(), n, seed)) + draw(bf16_strategy(), n, seed + 1_000_003)
            + draw(bf16_grouped_strategy(), max(1, n // 4), seed + 2_000_003))
