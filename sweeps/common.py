"""Shared pieces of the case spaces: deterministic hypothesis draws and bug-hunting strategies.

`draw(strategy, n, seed)` runs hypothesis' generator (which favours boundaries and small values)
without a test around it, so a sweep's extra cases are reproducible from `--seed`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings
from hypothesis import strategies as st


def draw(strategy, n: int, seed: int) -> list:
    """n examples of `strategy`, the same ones for the same seed (duplicates removed)."""
    if n <= 0:
        return []
    out: list = []

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @hyp_seed(seed)
    @given(strategy)
    def collect(example):
        if example not in out:
            out.append(example)

    collect()
    return out[:n]


def tile_counts(tile: int, max_tiles: int, lo: int = 1) -> st.SearchStrategy[int]:
    """Sizes that hide bugs: one element, tile boundaries +-1, several tiles, ragged remainders."""
    return st.one_of(
        st.just(lo),
        st.integers(1, max_tiles).map(lambda k: k * tile),
        st.integers(1, max_tiles).flatmap(lambda k: st.sampled_from([k * tile - 1, k * tile + 1])),
        st.integers(lo, max_tiles * tile),
    ).filter(lambda v: v >= lo)
