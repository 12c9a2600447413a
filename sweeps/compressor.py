"""Compressor case space (spec §5): CSA (m = 4, overlapping) and HCA (m = 128) pooling of the main
compressor (d = 512) with RMSNorm, RoPE at s·m (theta 160000 + YaRN) and the FP8 NoPE qdq.

Prefill: one sequence of S tokens from position 0 (⌊S/m⌋ entries). Decode-time emission: a batch
of sequences whose blocks complete together (B sequences of 2m tokens for CSA, m for HCA).

The indexer's compressor (`indexer: True`, §6: m = 4, d = 128, Hadamard + FP4 qdq): Flash and Pro
share its widths (index_head_dim 128, projections 2·128 wide: the model width D only sizes wkv / wgate,
which run before this op), so one set serves both: prefills of T = 4096 and 16384 (B = 1, 2), ragged
lengths (4097, 4098, 4099, 1001, 4·37 + 3, a single block, 5 and 7 tokens: lengths not a multiple of m,
the tail pooled by no entry) and decode-time emissions. Main-compressor cases carry no `indexer` key
(their ids unchanged).
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw

RATIOS = (4, 128)
REPORT_ROWS = "s"  # tokens per sequence: decode-time emission pools 2m or m of them; m is the ratio


def _case(m: int, b: int, s: int, d: int = 512) -> dict:
    return {"m": m, "b": b, "s": s, "d": d, "dtype": "bf16"}


INDEXER_M, INDEXER_D = 4, 128  # the indexer's compressor (§6): Flash and Pro alike
# prefills, ragged (every S mod 4 ≠ 0), one block, a single block plus a tail
INDEXER_LENGTHS = (4096, 16384, 4097, 4098, 4099, 1001, 4 * 37 + 3, 4, 5, 7)


def indexer_case(b: int, s: int) -> dict:
    return {"m": INDEXER_M, "b": b, "s": s, "d": INDEXER_D, "indexer": True, "dtype": "bf16"}


def production() -> list[dict]:
    cases = []
    for m in RATIOS:
        cases += [_case(m, 1, s) for s in (4096, 16384)]  # prefill
        cases += [_case(m, b, 2 * m if m == 4 else m) for b in (64, 128)]  # decode-time emission
        cases += [_case(m, 1, 1001 * (1 if m == 4 else 2)), _case(m, 1, m)]  # ragged tail, one entry
    cases += [indexer_case(1, s) for s in INDEXER_LENGTHS]
    cases += [indexer_case(2, 4096), indexer_case(3, 4099)]  # batched prefills
    cases += [indexer_case(b, 2 * INDEXER_M) for b in (64, 128)]  # decode-time emission
    return cases


def extra_strategy() -> st.SearchStrategy[dict]:
    def build(m, b, blocks, tail, d):
        return _case(m, b, blocks * m + tail % m, d)

    return st.builds(build, m=st.sampled_from(RATIOS), b=st.integers(1, 5), blocks=st.integers(1, 40),
                     tail=st.integers(0, 127), d=st.sampled_from([128, 256, 512, 512]))


def indexer_strategy() -> st.SearchStrategy[dict]:
    """The indexer's compressor: B 1-5 sequences of any length ≥ one block, tails 0-3 (S mod 4)."""
    length = st.builds(lambda blocks, tail: blocks * INDEXER_M + tail, st.integers(1, 300), st.integers(0, 3))
    return st.builds(indexer_case, b=st.integers(1, 5), s=length)


def extra(n: int, seed: int) -> list[dict]:
    """n draws of the main compressor (the same as before the indexer's cases), then n // 4 of the indexer's."""
    return draw(extra_strategy(), n, seed) + draw(indexer_strategy(), n // 4, seed)
