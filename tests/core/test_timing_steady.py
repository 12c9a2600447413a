"""The timer's transient rule (core/timing.steady) on crafted sample sets: CPU only."""

from dsv4bench.core.timing import TRANSIENT_RETRIES, steady, summarize


def _sets(*medians_and_spikes):
    """Sample sets of 100: `spike` of them at 40x the base, the rest at the base (a lent GPU's transient)."""
    out = iter([summarize([base * 40] * spike + [base] * (100 - spike), True) for base, spike in medians_and_spikes])
    calls = []

    def sample():
        calls.append(1)
        return next(out)
    return sample, calls


def test_a_steady_set_is_taken_once():
    sample, calls = _sets((0.0095, 5), (0.001, 0))
    stats = steady(sample)
    assert len(calls) == 1 and stats.median_ms == 0.0095 and stats.retimed == 0


def test_a_transient_set_is_taken_again_and_the_steady_one_kept():
    sample, calls = _sets((0.0095, 60), (0.0097, 0), (0.001, 0))
    stats = steady(sample)
    assert len(calls) == 2 and stats.median_ms == 0.0097 and stats.retimed == 1


def test_retries_are_bounded_and_the_lowest_median_wins():
    sample, calls = _sets((0.02, 70), (0.01, 60), (0.03, 90), (0.001, 0))
    stats = steady(sample)
    assert len(calls) == 1 + TRANSIENT_RETRIES and stats.median_ms == 0.4 and stats.retimed == 2
