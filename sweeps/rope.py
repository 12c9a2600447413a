"""RoPE case space (spec §2.2, §4, §6, §7.3): production shapes plus hypothesis extras.

ops: `q_norm_rope` the per-head weightless RMSNorm of q fused with RoPE (q [T, H, 512]);
`rope` the kv latent (H = 1) and the indexer q ([T, 64, 128]); `inverse` the attention output
(conjugate rotation, §7.3). Tables: `yarn` (theta 160000 + YaRN, CSA/HCA layers), `swa` (theta
10000, SWA-only layers and MTP). Positions: `prefill` = 0..T-1, `decode` = random up to 2^17.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

OPS = ("q_norm_rope", "rope", "inverse")
TABLES = ("yarn", "swa")
DECODE_T, PREFILL_T = (64, 128), (4096,)


def _case(op, t, h, n, table, pos, dtype="bf16") -> dict:
    return {"op": op, "t": t, "h": h, "n": n, "table": table, "pos": pos, "dtype": dtype}


def production() -> list[dict]:
    cases = []
    for h in (64, 128):  # Flash / Pro q heads
        for table in TABLES:
            cases += [_case("q_norm_rope", t, h, 512, table, "decode") for t in DECODE_T]
            cases += [_case("q_norm_rope", t, h, 512, table, "prefill") for t in PREFILL_T]
        cases += [_case("inverse", t, h, 512, "yarn", "decode") for t in DECODE_T]
        cases += [_case("inverse", t, h, 512, "yarn", "prefill") for t in PREFILL_T]
    for table in TABLES:  # kv latent: one row per token
        cases += [_case("rope", t, 1, 512, table, "decode") for t in DECODE_T]
        cases += [_case("rope", t, 1, 512, table, "prefill") for t in (4096, 16384)]
    cases += [_case("rope", t, 64, 128, "yarn", p) for t, p in ((64, "decode"), (4096, "prefill"))]  # indexer q
    cases += [_case("q_norm_rope", 1001, 64, 512, "yarn", "decode"), _case("rope", 1, 1, 512, "swa", "decode")]
    return cases


def extra_strategy() -> st.SearchStrategy[dict]:
    return st.builds(
        _case,
        op=st.sampled_from(OPS),
        t=tile_counts(4, 100),
        h=st.one_of(st.just(1), st.integers(1, 130)),
        n=st.one_of(st.sampled_from([64, 128, 512]), st.integers(8, 80).map(lambda k: 8 * k)),
        table=st.sampled_from(TABLES),
        pos=st.sampled_from(("prefill", "decode")),
        dtype=st.sampled_from(["bf16", "bf16", "fp16", "fp32"]),
    )


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
