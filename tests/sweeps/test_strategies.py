"""The shared case-space strategies draw what hides bugs, reproducibly, within their budget."""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, non_square, ragged_lengths, tile_counts, tile_counts_within, within_budget


def test_draw_is_reproducible_from_the_seed():
    s = tile_counts(64, 8)
    assert draw(s, 30, seed=7) == draw(s, 30, seed=7)
    assert draw(s, 30, seed=7) != draw(s, 30, seed=8)
    assert draw(s, 0, seed=7) == []


def test_tile_counts_hit_one_row_boundaries_and_multi_tile():
    sizes = set(draw(tile_counts(64, 8), 200, seed=1))
    assert 1 in sizes
    assert any(v % 64 == 0 and v > 64 for v in sizes)  # several whole tiles
    assert any(v % 64 in (1, 63) for v in sizes)  # tile boundary +- 1
    assert any(v % 64 not in (0, 1, 63) for v in sizes)  # ragged remainder
    assert all(1 <= v <= 8 * 64 + 1 for v in sizes)


def test_tile_counts_within_bounds_the_cost():
    width, budget = 8192, 1 << 20
    sizes = draw(tile_counts_within(4, 600, width, budget), 200, seed=2)
    assert max(sizes) * width <= budget + 4 * width  # at most one element past the capped tiles
    assert 1 in sizes
    assert draw(tile_counts_within(4, 600, 1 << 30, 1), 20, seed=2)  # never empty: at least one tile


def test_ragged_lengths_are_never_uniform_batches():
    batches = draw(ragged_lengths(64, 4, 6), 100, seed=3)
    assert all(len(set(b)) > 1 for b in batches if len(b) > 1)
    assert any(len(b) > 1 for b in batches) and any(1 in b for b in batches)


def test_non_square_pairs_differ():
    pairs = draw(non_square(tile_counts(64, 4)), 100, seed=4)
    assert pairs and all(a != b for a, b in pairs)


def test_within_budget_filters_by_cost():
    params = st.fixed_dictionaries({"m": st.integers(1, 4096), "n": st.integers(1, 4096)})
    drawn = draw(within_budget(params, lambda p: p["m"] * p["n"], 1 << 16), 50, seed=5)
    assert drawn and all(p["m"] * p["n"] <= 1 << 16 for p in drawn)
