"""The same-traffic copy's size (CPU): half the op's bytes each way, in whole 4 KiB (the GPU side of
the floor is tests/core/test_ceilings.py)."""

from __future__ import annotations

import pytest

from dsv4bench.core.ceilings import COPY_GRAIN, FLOOR_TIMINGS, SameTrafficCopy


@pytest.mark.parametrize("nbytes", [1, 8191, 8192, 8193, 4_600_000, 33_600_000.0, 117_500_000, (1 << 31) + 6])
def test_half_bytes_are_whole_4k_and_at_least_half(nbytes):
    half = SameTrafficCopy.half_bytes(nbytes)
    assert half % COPY_GRAIN == 0 and half >= nbytes / 2 and half - nbytes / 2 < COPY_GRAIN


def test_floors_of_sizes_in_one_grain_share_one_copy():
    timed = []

    class CountingTimer:
        def time(self, fn, min_iters):
            fn()
            timed.append(min_iters)
            return type("Stats", (), {"median_ms": 0.01 * len(timed)})()

    floor = SameTrafficCopy(CountingTimer(), "cpu")
    assert floor.ms(33_600_000) == floor.ms(33_600_001) == floor.ms(33_599_000.0)  # one 4 KiB grain each way
    assert floor.ms(33_600_000 + 2 * COPY_GRAIN) != floor.ms(33_600_000) and len(timed) == 2 * FLOOR_TIMINGS


def test_a_slow_timing_does_not_become_the_floor():
    """The floor is the fastest of its timings: one slow median (a transient of the lent GPU: two quant sizes'
    floors once came out 5-6x their neighbours') is not kept for every case of that size."""
    medians = iter([0.066, 0.0125, 0.013])

    class Timer:
        def time(self, fn, min_iters):
            fn()
            return type("Stats", (), {"median_ms": next(medians)})()

    assert SameTrafficCopy(Timer(), "cpu").ms(37_000_000) == 0.0125
