"""moe case space (spec §1.1, §8, issue #22): the routed experts of DSV4 Flash (256 experts, 4096 -> 2048
-> 4096, route scale 1.5) and Pro (384 experts, 7168 -> 3072 -> 7168, 2.5), 6 active per token, at decode
batches 1, 8, 64, 256 tokens (masked layout) and prefill 4096 / 16384 tokens (contiguous layout).

Three ops (`op`): `layer`, the whole routed layer (dispatch, w1/w3 + clamped SwiGLU x route weight, w2,
combine with the shared expert's output); `dispatch`, the token permutation + FP8 quantisation into the
layout the grouped GEMM reads; `combine`, the un-permutation back to token order.

Expert loads (`load`; kernels/moe/inputs.py draws them per case seed): uniform (6 distinct experts per
token), zipf (expert popularity 1/rank^1.2), hot (every token's first choice is expert 0: one expert
holds all T tokens), sparse (tokens only on the first eighth of the experts, at least 6: the rest are empty),
hash (ids drawn with replacement, like a tid2eid row: a token may hit one expert twice).

Expert cap: a case instantiates `e` experts, min(model experts, EXPERT_CAP[model]), and routes over
them. Every expert's weights are synthesised in the checkpoint's MXFP4 format (13.4 MB a Flash
expert, 35.1 MB a Pro one); all 384 Pro experts are 13.5 GB, and the harness keeps a copy of the
inputs, the DeepGEMM peer an FP8 copy (2x) and the torch peers a bf16 copy (4x). With the cap a case
stays under ~10 GB of device memory (tests/moe/test_moe_cpu.py checks the estimate). The cap lowers
the distinct experts a large decode batch touches (docs/perf/moe.md gives the uncapped model's
weight bytes next to the measured cases').
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

TOPK = 6
MODELS = {  # name: (routed experts, hidden D, intermediate I, route scale)
    "flash": (256, 4096, 2048, 1.5),
    "pro": (384, 7168, 3072, 2.5),
}
EXPERT_CAP = {"flash": 64, "pro": 16}
DECODE_T = (1, 8, 64, 256)
PREFILL_T = (4096, 16384)
LOADS = ("uniform", "zipf", "hot", "sparse", "hash")
SKEW_T = (64, 4096)  # the token counts at which every load is a case (uniform: at every count)
OPS = ("layer", "dispatch", "combine")


def case(op: str, model: str, t: int, load: str = "uniform", e: int | None = None, d: int | None = None,
         i: int | None = None, scale: float | None = None) -> dict:
    n_e, n_d, n_i, n_scale = MODELS.get(model, (None, None, None, 1.5))
    e = e or min(n_e, EXPERT_CAP[model])
    layout = "masked" if t <= max(DECODE_T) else "contiguous"
    return {"op": op, "model": model, "e": e, "d": d or n_d, "i": i or n_i, "k": TOPK, "t": t, "load": load,
            "layout": layout, "scale": scale or n_scale}


def production() -> list[dict]:
    out = []
    for op in OPS:
        for model in MODELS:
            for t in DECODE_T + PREFILL_T:
                loads = LOADS if t in SKEW_T else ("uniform",)
                out += [case(op, model, t, load) for load in loads]
    return out


def extra_strategy() -> st.SearchStrategy[dict]:
    """Small layers (CPU-checkable): D and I whole 128-blocks, ragged token counts around the 128-row
    tile, few experts (so most are several tiles or empty), every load and op; both layouts."""
    return st.builds(
        lambda op, t, e, d, i, load, masked: {**case(op, "drawn", t, load, e, 128 * d, 128 * i),
                                              "layout": "masked" if masked else "contiguous"},
        st.sampled_from(OPS), tile_counts(128, 3), st.integers(1, 12), st.integers(1, 8), st.integers(1, 6),
        st.sampled_from(LOADS), st.booleans(),
    )


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
