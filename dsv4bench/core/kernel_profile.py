"""Where an impl's time goes: the device time of each kernel one call launches (CUPTI, through
torch.profiler), next to the CUDA-event time of the whole call.

The event window of `core.timing` also holds the launch latency and any gap between an impl's
kernels; the kernels' own durations tell "the kernel is slow" from "the call is slow" (two
launches, a host sync, a small kernel behind a ~2 us launch). The L2 is flushed before every
profiled call as in the timer; the flush's own kernels are profiled alone first and subtracted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

NAME_CHARS = 80  # kernel names of templated code run to kilobytes


def _device_us_by_name(prof) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", 0.0)
        if us > 0:
            totals[evt.key[:NAME_CHARS]] += us
    return totals


def _profile(torch, body: Callable[[], None], iters: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            body()
        torch.cuda.synchronize()
    return _device_us_by_name(prof)


NOISE_US = 0.5


def kernel_times(fn: Callable[[], object], flush: Callable[[], None] | None, iters: int = 5) -> dict[str, float]:
    """Mean device µs per call of each kernel (by name) that `fn` launches, flush excluded."""
    import torch

    fn()  # nothing lazy (first-call setup, allocator growth) inside the profile
    torch.cuda.synchronize()

    def with_flush():
        if flush is not None:
            flush()
        fn()

    flush_only = _profile(torch, flush, iters) if flush is not None else {}
    both = _profile(torch, with_flush, iters)
    out = {}
    for name, us in both.items():
        mine = (us - flush_only.get(name, 0.0)) / iters
        # a name the flush also launches (its memset): keep only a real excess, above 5% of the total and
        # above NOISE_US (a GPU shared with other processes moves the flush's own memset by ~0.05 us)
        if name not in flush_only or mine > max(0.05 * us / iters, NOISE_US):
            out[name] = round(mine, 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
