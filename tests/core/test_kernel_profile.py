"""The per-kernel split of a call: its kernels' device time, the L2 flush's own kernels taken out."""

from __future__ import annotations

import pytest

from dsv4bench.core import kernel_profile
from dsv4bench.core.timing import CudaTimer


def test_the_flush_is_subtracted_by_name_and_only_a_real_excess_is_kept(monkeypatch):
    profiles = iter([
        {"fill": 50.0, "max_reduce": 40.0},  # flush alone, 5 calls
        {"fill": 50.0, "max_reduce": 40.4, "my_kernel": 30.0, "fill_of_mine_too": 7.5},  # flush + fn
    ])
    monkeypatch.setattr(kernel_profile, "_profile", lambda torch, body, iters: next(profiles))
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)  # no GPU here: the profiles are canned
    got = kernel_profile.kernel_times(lambda: None, lambda: None, iters=5)
    # my_kernel 30/5, the new name 7.5/5; "max_reduce" differs by noise (0.4 of 40) and is dropped
    assert got == {"my_kernel": 6.0, "fill_of_mine_too": 1.5}


@pytest.mark.gpu
def test_a_copy_and_an_add_are_split_and_fit_inside_the_event_time():
    import torch

    timer = CudaTimer("cuda")
    a = torch.randn(1 << 26, device="cuda")  # 256 MiB
    b = torch.empty_like(a)

    def call():
        b.copy_(a)
        b.add_(1.0)

    kernels = kernel_profile.kernel_times(call, timer.flush)
    event_us = timer.time(call).median_ms * 1e3
    print(f"kernels {kernels}, event-timed {event_us:.1f} us")
    assert len(kernels) == 2  # the copy and the add; none of the flush's memset / max
    total = sum(kernels.values())
    # each streams 512 MiB: ~180 us at 3 TB/s; device time is inside the event window, launch gaps aside
    assert 0.7 * event_us < total <= event_us
    assert all(100 < us < 400 for us in kernels.values())
