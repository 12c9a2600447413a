"""GPU timing: CUDA events around the region, L2 flushed before every iteration.

Protocol (docs/benchmarking.md): warm-up first (compilation and module load stay out; at least WARMUP_MS of flushed
calls, lesson 22); before
each iteration a memset of a buffer >= 2x the L2 evicts the cache, and a read sweep of the same
buffer then evicts the memset's dirty lines: left dirty, the timed call pays their write-back (up
to the 50 MB of the L2, ~7-9 us on the H100: docs/lessons/harness.md); events bracket the call alone;
at least `min_iters` iterations, more while the spread is large. The flush also hides the host's
launch overhead: the GPU is still busy with the memset while the host enqueues the timed call.
A sample set whose median sits far above its p10 caught a transient of the lent GPU, and one whose first samples
run slower than its last started inside one: either is taken again (`steady`).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable

FLUSH_MIN_BYTES = 256 << 20
# a sample set whose median is this far above its p10 is re-taken, at most TRANSIENT_RETRIES more times
# (docs/lessons/harness.md 18: 100 graph replays of a 9.5 us GEMM read 400-1500 us for ~60 samples, then 9.5 again)
TRANSIENT_RATIO = 1.25
TRANSIENT_RETRIES = 2
# a sample set whose first quarter's median is this far above its last quarter's started inside a transient
# (docs/lessons/harness.md 22: a Pro MoE decode call's first ~12 replays after its correctness check ran 7% slow)
DRIFT_RATIO = 1.03
# the warm-up runs flushed calls for at least this long (and at least `warmup` of them) before any sample
WARMUP_MS = 25.0
WARMUP_ROUNDS_MAX = 1000


@dataclass
class TimingStats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    cv: float  # coefficient of variation (stdev / mean)
    n: int
    l2_flush: bool
    samples_ms: list[float] = field(default_factory=list)
    mode: str = "events"  # "graph": the replays of the call captured in a CUDA graph (core/graphs.py)
    retimed: int = 0  # sample sets dropped as transients before this one (`steady`)

    def to_json(self) -> dict:
        return asdict(self)


def _quantile(sorted_vals: list[float], q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(samples_ms: list[float], l2_flush: bool) -> TimingStats:
    s = sorted(samples_ms)
    mean = statistics.fmean(s)
    cv = statistics.pstdev(s) / mean if mean > 0 and len(s) > 1 else 0.0
    return TimingStats(
        statistics.median(s), _quantile(s, 0.1), _quantile(s, 0.9), mean, cv, len(s), l2_flush, list(samples_ms)
    )


def drifting(samples_ms: list[float]) -> bool:
    """The set (in the order taken) ran slower at its start than at its end: its first quarter's median more than
    DRIFT_RATIO above its last quarter's (sets under 8 samples are not judged)."""
    q = len(samples_ms) // 4
    if q < 2:
        return False
    return statistics.median(samples_ms[:q]) > DRIFT_RATIO * statistics.median(samples_ms[-q:])


def unsteady(stats: TimingStats) -> bool:
    """A transient (median > TRANSIENT_RATIO x p10) or a drift (`drifting`) in the set."""
    return stats.median_ms > TRANSIENT_RATIO * stats.p10_ms or drifting(stats.samples_ms)


def steady(sample: Callable[[], TimingStats], retries: int = TRANSIENT_RETRIES) -> TimingStats:
    """`sample()`, taken again while the last set is `unsteady`, at most `retries` more times: the set with the
    lowest median, its `retimed` the number of sets dropped."""
    sets = [sample()]
    while len(sets) <= retries and unsteady(sets[-1]):
        sets.append(sample())
    best = min(sets, key=lambda st: st.median_ms)
    best.retimed = len(sets) - 1
    return best


class CudaTimer:
    def __init__(self, device: str = "cuda", flush_l2: bool = True):
        import torch

        self.torch = torch
        self.flush_l2 = flush_l2
        self.flush_buf = None
        if flush_l2:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
            self.flush_buf = torch.empty(max(2 * l2, FLUSH_MIN_BYTES), dtype=torch.uint8, device=device)
            self.flush_words = self.flush_buf.view(torch.int32)

    def flush(self) -> None:
        """Evict the L2 (no-op without flushing): a memset, then a read sweep so the L2 is left
        full of clean lines."""
        if self.flush_buf is not None:
            self.flush_buf.zero_()
            self.flush_words.max()

    def time(
        self, fn: Callable[[], object], *, warmup: int = 3, min_iters: int = 20, max_iters: int = 100,
        target_cv: float = 0.03,
    ) -> TimingStats:
        self._warm(fn, warmup)
        return steady(lambda: self._sample(fn, min_iters, max_iters, target_cv))

    def _warm(self, fn: Callable[[], object], warmup: int) -> None:
        """Flushed calls, `warmup` at a time, until at least WARMUP_MS of them have run (a lent GPU's first calls after
        other work can run slow for milliseconds: lesson 22)."""
        torch = self.torch
        spent = 0.0
        for _ in range(WARMUP_ROUNDS_MAX):  # bounded: a call that times as 0 ms must not spin forever
            if spent >= WARMUP_MS:
                break
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(max(warmup, 1)):
                self.flush()
                fn()
            end.record()
            torch.cuda.synchronize()
            spent += start.elapsed_time(end)

    def _sample(self, fn: Callable[[], object], min_iters: int, max_iters: int, target_cv: float) -> TimingStats:
        torch = self.torch
        samples: list[float] = []
        while True:
            pairs = []
            for _ in range(min_iters):
                self.flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize()
            samples += [s.elapsed_time(e) for s, e in pairs]
            stats = summarize(samples, self.flush_l2)
            if stats.cv <= target_cv or len(samples) >= max_iters:
                return stats
