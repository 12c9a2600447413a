"""Shared pieces of the case spaces: deterministic hypothesis draws and bug-hunting strategies.

`draw(strategy, n, seed)` runs hypothesis' generator (which favours boundaries and small values)
without a test around it and without deadlines (a first call compiles), so a sweep's extra cases
are reproducible from `--seed`. The strategies favour what hides bugs: one element, tile
boundaries +-1, several tiles, ragged remainders (`tile_counts`), ragged batches
(`ragged_lengths`), non-square pairs (`non_square`), with a bounded cost per example
(`tile_counts_within`, `within_budget`). Cases that once failed are replayed from the regression
file (dsv4bench.core.regressions), not from hypothesis' database.
A family may set `REPORT_AXES = ("hd", "s_kv")` in its module: the params its error heatmaps span;
and `REPORT_ROWS = "t"`: its token-count param, which splits the report into decode and prefill
(None: no split; unset: the first of speedup.ROWS_PARAMS that a case has).
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


def tile_counts_within(tile: int, max_tiles: int, per_unit: float, budget: float, lo: int = 1) -> st.SearchStrategy[int]:
    """`tile_counts` capped so that size x per_unit stays within `budget` (at least one tile):
    draw the other dimension first, then this one, and every example's cost is bounded by
    construction, never by filtering."""
    cap = int(budget // (tile * per_unit)) if per_unit > 0 else max_tiles
    return tile_counts(tile, max(1, min(max_tiles, cap)), lo)


def ragged_lengths(tile: int, max_tiles: int, max_seqs: int) -> st.SearchStrategy[list[int]]:
    """Per-sequence lengths of a variable-length batch: each one a bug-hiding size (one element,
    tile boundary +-1, several tiles, ragged), and the batch as a whole never uniform when it has
    more than one sequence."""
    return st.lists(tile_counts(tile, max_tiles), min_size=1, max_size=max_seqs).filter(
        lambda xs: len(xs) == 1 or len(set(xs)) > 1)


def non_square(a: st.SearchStrategy[int], b: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[tuple]:
    """Pairs of sizes that differ: square shapes hide transposed-layout bugs."""
    return st.tuples(a, a if b is None else b).filter(lambda ab: ab[0] != ab[1])


def within_budget(params: st.SearchStrategy[dict], cost, budget: float) -> st.SearchStrategy[dict]:
    """Case params whose `cost(params)` (e.g. flops or bytes) is at most `budget`. A filter, so
    use it where over-budget draws are rare; prefer `tile_counts_within` where a size can be capped."""
    return params.filter(lambda p: cost(p) <= budget)
