"""mHC case space (spec §3): hc_pre, hc_post, hc_head at the Flash / Pro widths plus hypothesis extras.

D = 4096 (Flash) / 7168 (Pro); the residual is [T, 4, D] bf16; hc_pre/hc_post run twice per layer
on every token; hc_head once per forward (decode: every token; prefill: every position).
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

OPS = ("pre", "post", "head")
DECODE_T, PREFILL_T = (64, 128), (4096,)


def _case(op: str, t: int, d: int) -> dict:
    return {"op": op, "t": t, "d": d, "dtype": "bf16"}


def production() -> list[dict]:
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
    ]


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


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
