"""compressor_decode case space (spec §5.5, §5.7): the decode-time compressor ops for the model's three
compressors, CSA (m = 4, d = 512), HCA (m = 128, d = 512) and the indexer's (m = 4, d = 128); Flash and
Pro share these widths.

  push  {m, b, t, d}: token t of B sequences (decode batches 1 / 32 / 128) into the reference's fp32
        state, at block boundaries: the first block's last token (t = m − 1: CSA's previous block
        absent), the next block's first (t = m), a later block's last and a token mid-block (no
        emission), deep in the context.
  post  {m, b, d, indexer}: B raw entries post-processed (main: FP8 NoPE qdq; indexer: Hadamard + FP4).

Draws: batches off any tile (1..130, 31 / 33 / 127 / 129), positions at and around block boundaries
(blocks 0, 1, 2 and 4095), each compressor.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw

DECODE_B = (1, 32, 128)
COMPRESSORS = ((4, 512, False), (128, 512, False), (4, 128, True))  # (m, d, indexer): CSA, HCA, the indexer's
REPORT_ROWS = "b"  # decode rows: sequences (push) or entries (post)


def push_case(m: int, b: int, t: int, d: int = 512) -> dict:
    return {"op": "push", "m": m, "b": b, "t": t, "d": d, "dtype": "fp32"}


def post_case(m: int, b: int, d: int = 512, indexer: bool = False) -> dict:
    return {"op": "post", "m": m, "b": b, "d": d, "indexer": indexer, "dtype": "fp32"}


def boundary_positions(m: int) -> tuple[int, ...]:
    """Block 0's last token, block 1's first, a later block's last, a token mid-block (no emission)."""
    return (m - 1, m, 1000 * m + m - 1, 1000 * m + m // 2)


def production() -> list[dict]:
    cases = []
    for m, d, indexer in COMPRESSORS:
        cases += [push_case(m, b, t, d) for b in DECODE_B for t in boundary_positions(m)]
        cases += [post_case(m, b, d, indexer) for b in DECODE_B]
    return cases


def extra_strategy() -> st.SearchStrategy[dict]:
    def build(op, which, b, block, k):
        m, d, indexer = COMPRESSORS[which]
        if op == "post":
            return post_case(m, b, d, indexer)
        return push_case(m, b, block * m + (m - 1 + k) % m, d)  # k = 0: a block's last token

    return st.builds(build, op=st.sampled_from(["push", "push", "post"]), which=st.integers(0, len(COMPRESSORS) - 1),
                     b=st.one_of(st.sampled_from([1, 31, 33, 127, 129]), st.integers(1, 130)),
                     block=st.sampled_from([0, 1, 2, 4095]), k=st.sampled_from([0, 0, 1, 2, 64]))


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
