"""FMHA case space: DSV4 sparse attention (spec §7) plus the general dense head_dim sweep.

Params of one case:
  mask      sparse | none | causal | window | causal_window
  hd        q/k and v head dim (64, 128, 256, 512)
  b, h_q, h_kv, s_q, s_kv
  topk      sparse: index slots per query token (window part included); dense: 0
  window    sparse: how many of the slots are the §7.1 raw window (0 or 128); dense: window keys
  select    sparse: how the non-window slots are chosen: random (CSA-like top-k), hca, none
  invalid   sparse: fraction of selected slots replaced by -1
  kv_layout sparse: shared (one kv pool for all queries) or per_token (decode: disjoint rows)
  sink, kv_shared (V is K: the DSV4 latent), lse (LSE is an output)
  op        absent (= attention) or decode_fp8: one query token per request over FlashMLA's two
            paged FP8 caches (kernels/fmha/decode_family.py); then s_kv is the context per request,
            topk = window + compressed top-k, block the page size, ragged / dup as described there
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

WINDOW = 128
HEAD_DIMS = (64, 128, 256, 512)
MASKS = ("sparse", "none", "causal", "window", "causal_window")
# (name, h_q, compressed top-k) of the two DSV4 models
MODELS = (("flash", 64, 512), ("pro", 128, 1024))


def _sparse(hd=512, h_q=128, s_q=256, s_kv=None, topk=WINDOW + 64, window=WINDOW, select="random",
            invalid=0.0, kv_layout="shared", sink=True, kv_shared=True, lse=True) -> dict:
    if s_kv is None:
        s_kv = s_q * topk if kv_layout == "per_token" else s_q + max(topk, s_q // 4)
    return {"mask": "sparse", "hd": hd, "b": 1, "h_q": h_q, "h_kv": 1, "s_q": s_q, "s_kv": s_kv,
            "topk": topk, "window": window, "select": select, "invalid": invalid, "kv_layout": kv_layout,
            "sink": sink, "kv_shared": kv_shared, "lse": lse}


def _decode(h_q=64, b=1, ctx=8192, k=512, window=WINDOW, block=64, invalid=0.0, ragged=False, dup=False,
            sink=True) -> dict:
    return {"op": "decode_fp8", "mask": "sparse", "hd": 512, "b": b, "h_q": h_q, "h_kv": 1, "s_q": 1,
            "s_kv": ctx, "topk": window + k, "window": window, "select": "random", "invalid": invalid,
            "kv_layout": "paged_fp8", "sink": sink, "kv_shared": True, "lse": True, "block": block,
            "ragged": ragged, "dup": dup}


def decode_production() -> list[dict]:
    """FP8-cache decode (issue #25): Flash and Pro at 1, 32, 64, 128 requests, contexts 8K and 128K."""
    return [_decode(h_q=h_q, b=b, ctx=ctx, k=k) for _name, h_q, k in MODELS for ctx in (8192, 131072)
            for b in (1, 32, 64, 128)]


def decode_strategy() -> st.SearchStrategy[dict]:
    """Ragged lengths, -1 indices, fewer valid keys than top-k (short contexts), duplicates, pages
    of 64 and of an odd size, top-k around tile boundaries."""
    return st.builds(
        lambda h_q, b, ctx, k, block, invalid, ragged, dup, sink: _decode(
            h_q=h_q, b=b, ctx=ctx, k=k, block=block, invalid=invalid, ragged=ragged, dup=dup, sink=sink),
        st.sampled_from([64, 128]), st.sampled_from([1, 2, 3, 7, 33]),
        st.sampled_from([1, 100, 511, 2049, 8192]), st.sampled_from([1, 63, 64, 65, 512, 1024]),
        st.sampled_from([64, 61]), st.sampled_from([0.0, 0.1, 0.9]), st.booleans(), st.booleans(), st.booleans(),
    )


def _dense(hd, mask, b=2, h_q=4, h_kv=2, s_q=300, s_kv=517, window=0, sink=False, kv_shared=False,
           lse=True) -> dict:
    if "window" in mask and not window:
        window = 97
    return {"mask": mask, "hd": hd, "b": b, "h_q": h_q, "h_kv": h_kv, "s_q": s_q, "s_kv": s_kv,
            "topk": 0, "window": window if "window" in mask else 0, "select": "none", "invalid": 0.0,
            "kv_layout": "shared", "sink": sink, "kv_shared": kv_shared, "lse": lse}


def dsv4_production() -> list[dict]:
    """The DSV4 shapes: CSA prefill/decode for Flash and Pro, HCA and SWA-only layers."""
    cases = []
    for _name, h_q, k in MODELS:
        # prefill (1024 tokens: every CTA does the production work; benchmarks/ times s_q 4096)
        cases.append(_sparse(h_q=h_q, s_q=1024, topk=k + WINDOW, s_kv=1024 + 2048, lse=False))
        cases.append(_sparse(h_q=h_q, s_q=64, topk=k + WINDOW, window=0, kv_layout="per_token"))  # decode
        cases.append(_sparse(h_q=h_q, s_q=333, topk=k + WINDOW, invalid=0.25))  # ragged lists
    cases.append(_sparse(h_q=128, s_q=1000, topk=WINDOW + 1000 // 128, select="hca", s_kv=1000 + 1000 // 128))
    cases.append(_sparse(h_q=64, s_q=517, topk=WINDOW, select="none", s_kv=517))  # SWA-only layer
    return cases


def dense_production() -> list[dict]:
    """Every head dim x mask x sink on a non-square GQA shape, decode with heads packed into M,
    s_q > s_kv, and a separate-V head_dim 512 case."""
    cases = []
    for hd in HEAD_DIMS:
        for mask in MASKS[1:]:
            for sink in (False, True):
                cases.append(_dense(hd, mask, sink=sink, kv_shared=hd == 512))
        cases.append(_dense(hd, "causal", b=3, h_q=20, h_kv=1, s_q=1, s_kv=1000))  # decode, MQA
        cases.append(_dense(hd, "none", b=1, h_q=3, h_kv=3, s_q=129, s_kv=65, sink=True))  # s_q > s_kv
    cases.append(_dense(512, "causal", kv_shared=False))
    return cases


def dense_bench() -> list[dict]:
    """The dense peer-comparison shapes (docs/benchmarking.md: b4 s4096 h16, hd 128/256), kept out of
    the default grid: their FP32 oracle is minutes on a CPU. benchmarks/fmha_bench.py times them."""
    return [_dense(hd, mask, b=4, h_q=16, h_kv=16, s_q=4096, s_kv=4096, lse=False)
            for hd in (128, 256) for mask in ("none", "causal")]


def production() -> list[dict]:
    return dsv4_production() + dense_production() + decode_production()


def extra_strategy() -> st.SearchStrategy[dict]:
    hd = st.sampled_from(HEAD_DIMS)
    sparse = st.builds(
        lambda hd, h_q, s_q, topk, invalid, sink, shared, lse: _sparse(
            hd=hd, h_q=h_q, s_q=s_q, topk=topk, window=0, invalid=invalid, sink=sink,
            kv_shared=shared or hd == 512, lse=lse),
        hd, st.sampled_from([1, 3, 16, 64, 65, 128]), tile_counts(64, 4), tile_counts(64, 6),
        st.sampled_from([0.0, 0.1, 0.9]), st.booleans(), st.booleans(), st.booleans(),
    )
    heads = st.sampled_from([(1, 1), (4, 4), (8, 2), (20, 4), (64, 1), (3, 1)])
    dense = st.builds(
        lambda hd, mask, hk, s_q, s_kv, b, window, sink, lse: _dense(
            hd, mask, b=b, h_q=hk[0], h_kv=hk[1], s_q=s_q, s_kv=s_kv, window=window, sink=sink,
            kv_shared=hd == 512, lse=lse),
        hd, st.sampled_from(MASKS[1:]), heads, tile_counts(64, 4), tile_counts(64, 6), st.integers(1, 3),
        st.sampled_from([1, 63, 64, 65, 200]), st.booleans(), st.booleans(),
    )
    return st.one_of(sparse, dense)


def extra(n: int, seed: int) -> list[dict]:
    """n draws: a quarter of them FP8-cache decode cases, the rest attention cases."""
    n_dec = n // 4
    return draw(extra_strategy(), n - n_dec, seed) + draw(decode_strategy(), n_dec, seed)
