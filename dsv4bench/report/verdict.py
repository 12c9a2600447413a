"""A/B timing verdicts from the spread of two runs' samples (in the spirit of nvbench-compare).

Each side is summarized by its median and its p10..p90 interval. The new run is
- FASTER / SLOWER when the two intervals do not overlap and the medians differ by more than
  `threshold` (a clear win or loss: no plausible noise explains it);
- SAME when the medians differ by at most `threshold` and both sides are quiet (relative
  p10..p90 spread at most `max_noise`);
- NOISY otherwise: the intervals overlap yet the medians moved, or a side is too noisy to
  resolve a `threshold`-sized change. Re-measure before believing either way.
"""

from __future__ import annotations

from dataclasses import dataclass

SAME, FASTER, SLOWER, NOISY = "SAME", "FASTER", "SLOWER", "NOISY"
THRESHOLD = 0.03  # the timing protocol's target coefficient of variation
MAX_NOISE = 0.25  # relative p10..p90 width beyond which a side cannot resolve THRESHOLD


@dataclass(frozen=True)
class Spread:
    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, timing: dict) -> "Spread":
        return cls(float(timing["median_ms"]), float(timing["p10_ms"]), float(timing["p90_ms"]))

    @property
    def noise(self) -> float:
        return (self.p90 - self.p10) / self.median if self.median > 0 else float("inf")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    change: float  # new median / base median - 1 (negative: the new run is faster)
    base_noise: float
    new_noise: float


def verdict(base: Spread, new: Spread, threshold: float = THRESHOLD, max_noise: float = MAX_NOISE) -> Verdict:
    change = new.median / base.median - 1.0 if base.median > 0 else float("inf")
    disjoint = new.p90 < base.p10 or new.p10 > base.p90
    if disjoint and abs(change) > threshold:
        v = FASTER if change < 0 else SLOWER
    elif abs(change) <= threshold and max(base.noise, new.noise) <= max_noise:
        v = SAME
    else:
        v = NOISY
    return Verdict(v, change, base.noise, new.noise)
