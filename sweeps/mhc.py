"""mHC case space (spec §3): hc_pre, hc_post, hc_head at the Flash / Pro widths plus hypothesis extras,
and the embedding lookup that fills the streams (op "embed", §3.1).

D = 4096 (Flash) / 7168 (Pro); the residual is [T, 4, D] bf16; hc_pre/hc_post run twice per layer
on every token; hc_head once per forward (decode: every token; prefill: every position).

embed: T token ids into a [V, D] bf16 table (V = 129,280, the Flash / Pro vocabulary) → [T, 4, D];
decode batches T = 1 / 32 / 128 and a prefill of 4096. Its draws (small tables, T off any tile, ids
at 0 and V − 1, negative ids) follow the hc draws in `extra`, so those keep their case ids.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

OPS = ("pre", "post", "head")
DECODE_T, PREFILL_T = (64, 128), (4096,)
VOCAB = 129280  # Flash and Pro
EMBED_T = (1, 32, 128, 4096)


def _case(op: str, t: int, d: int) -> dict:
    return {"op": op, "t": t, "d": d, "dtype": "bf16"}


def embed_case(t: int, d: int, v: int = VOCAB, ids: str = "random") -> dict:
    """ids: random (uniform over the table), edges (0, V − 1 and negative ids −1, −V among them)."""
    return {"op": "embed", "t": t, "d": d, "v": v, "ids": ids, "dtype": "bf16"}


def production() -> list[dict]:
    embed = [embed_case(t, d) for d in (4096, 7168) for t in EMBED_T] + [embed_case(7, 4096, ids="edges")]
    cases = [
        _case(op, t, d)
        for op in OPS
        for d in (4096, 7168)
        for t in DECODE_T + PREFILL_T
    ]
    # D = 4056: pass 1 splits 4·D in 507 chunks of 32, so pass 2 stages one token's partials in 3 pieces
    return cases + [
        _case("pre", 1001, 4096),
        _case("post", 1, 7168),
        _case("head", 1, 4096),
        _case("pre", 64, 4056),
    ] + embed


def extra_strategy() -> st.SearchStrategy[dict]:
    return st.builds(
        _case,
        op=st.sampled_from(OPS),
        t=tile_counts(32, 20),
        d=st.one_of(
            st.sampled_from([8, 64, 1024, 4096, 7168]),
            st.integers(1, 600).map(lambda k: 8 * k),
        ),
    )


def embed_strategy() -> st.SearchStrategy[dict]:
    return st.builds(embed_case, t=tile_counts(32, 20), d=st.sampled_from([8, 64, 1024, 4096, 7168]),
                     v=st.one_of(st.just(1), st.integers(2, 5000)), ids=st.sampled_from(["random", "edges"]))


def extra(n: int, seed: int) -> list[dict]:
    """n draws of the hc ops (those recorded before embed existed), then n // 2 embed draws."""
    return draw(extra_strategy(), n, seed) + draw(embed_strategy(), n // 2, seed)
