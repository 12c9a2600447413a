"""Compressor case space (spec §5): CSA (m = 4, overlapping) and HCA (m = 128) pooling of the main
compressor (d = 512) with RMSNorm, RoPE at s·m (theta 160000 + YaRN) and the FP8 NoPE qdq.

Prefill: one sequence of S tokens from position 0 (⌊S/m⌋ entries). Decode-time emission: a batch
of sequences whose blocks complete together (B sequences of 2m tokens for CSA, m for HCA).
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw

RATIOS = (4, 128)
REPORT_ROWS = "s"  # tokens per sequence: decode-time emission pools 2m or m of them; m is the ratio


def _case(m: int, b: int, s: int, d: int = 512) -> dict:
    return {"m": m, "b": b, "s": s, "d": d, "dtype": "bf16"}


def production() -> list[dict]:
    cases = []
    for m in RATIOS:
        cases += [_case(m, 1, s) for s in (4096, 16384)]  # prefill
        cases += [_case(m, b, 2 * m if m == 4 else m) for b in (64, 128)]  # decode-time emission
        cases += [_case(m, 1, 1001 * (1 if m == 4 else 2)), _case(m, 1, m)]  # ragged tail, one entry
    return cases


def extra_strategy() -> st.SearchStrategy[dict]:
    def build(m, b, blocks, tail, d):
        return _case(m, b, blocks * m + tail % m, d)

    return st.builds(build, m=st.sampled_from(RATIOS), b=st.integers(1, 5), blocks=st.integers(1, 40),
                     tail=st.integers(0, 127), d=st.sampled_from([128, 256, 512, 512]))


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
