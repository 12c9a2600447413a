"""A/B verdicts on synthetic timing distributions: clear win, clear loss, overlap, no change."""

from __future__ import annotations

import random

import pytest

from dsv4bench.core.timing import summarize
from dsv4bench.report.verdict import FASTER, NOISY, SAME, SLOWER, Spread, verdict


def spread(mean_ms: float, rel_sd: float, seed: int, n: int = 60) -> Spread:
    rng = random.Random(seed)
    return Spread.of(summarize([mean_ms * (1 + rng.gauss(0, rel_sd)) for _ in range(n)], True).to_json())


def test_clear_win():
    v = verdict(spread(1.00, 0.01, 1), spread(0.80, 0.01, 2))
    assert v.verdict == FASTER
    assert v.change == pytest.approx(-0.2, abs=0.01)


def test_clear_loss():
    v = verdict(spread(1.00, 0.01, 3), spread(1.25, 0.01, 4))
    assert v.verdict == SLOWER
    assert v.change == pytest.approx(0.25, abs=0.01)


def test_overlapping_distributions_with_a_moved_median_are_noisy():
    base, new = spread(1.00, 0.10, 5), spread(1.08, 0.10, 6)
    assert new.p10 < base.p90  # they overlap
    assert verdict(base, new).verdict == NOISY


def test_same_distribution_is_same():
    assert verdict(spread(1.00, 0.01, 7), spread(1.00, 0.01, 8)).verdict == SAME


def test_tiny_but_separable_shift_is_same():
    # tight enough that the intervals separate, yet below the threshold: not a speed claim
    v = verdict(spread(1.00, 0.001, 9), spread(1.01, 0.001, 10))
    assert v.verdict == SAME


def test_equal_medians_under_heavy_noise_are_noisy():
    v = verdict(spread(1.00, 0.20, 11), spread(1.00, 0.20, 12))
    assert v.new_noise > 0.25 and v.verdict == NOISY


def test_slower_needs_separation_not_just_a_bigger_median():
    base = Spread(median=1.0, p10=0.9, p90=1.3)
    assert verdict(base, Spread(median=1.2, p10=1.1, p90=1.4)).verdict == NOISY
    assert verdict(base, Spread(median=1.5, p10=1.4, p90=1.6)).verdict == SLOWER
