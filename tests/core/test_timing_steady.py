"""The timer's transient rule (core/timing.steady) on crafted sample sets: CPU only."""

from dsv4bench.core.timing import TRANSIENT_RETRIES, drifting, steady, summarize


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


def test_a_set_that_starts_slow_is_taken_again():
    """Lesson 24: 9 of 60 samples at 500 then 465 (a Pro MoE decode call after its check) is a drift, not the call."""
    sets = iter([summarize([0.5] * 9 + [0.465] * 51, True), summarize([0.465] * 60, True)])
    calls = []

    def sample():
        calls.append(1)
        return next(sets)
    stats = steady(sample)
    assert len(calls) == 2 and stats.median_ms == 0.465 and stats.retimed == 1
    assert drifting([0.5] * 9 + [0.465] * 51) and not drifting([0.465] * 51 + [0.5] * 9)
    assert not drifting([0.48, 0.47, 0.49] * 20) and not drifting([0.5] * 7)  # noise, and too few to judge


def test_the_warm_up_runs_flushed_calls_for_warmup_ms(monkeypatch):
    """CudaTimer._warm: rounds of `warmup` flushed calls until WARMUP_MS of them have run, bounded for a 0 ms call."""
    from types import SimpleNamespace

    from dsv4bench.core import timing

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def elapsed_time(self, end):
            return round_ms

    timer = object.__new__(timing.CudaTimer)
    timer.torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: None))
    log = []
    timer.flush = lambda: log.append("flush")
    for round_ms, want_rounds in ((4.0, 7), (0.0, timing.WARMUP_ROUNDS_MAX)):
        log.clear()
        timer._warm(lambda: log.append("call"), 3)
        assert log == ["flush", "call"] * 3 * want_rounds
