"""The same-traffic copy floor: a device copy of the case's bytes, timed like the case."""

from __future__ import annotations

import pytest

from dsv4bench.core import ceilings
from dsv4bench.core.timing import CudaTimer

pytestmark = [pytest.mark.gpu]


def test_same_traffic_copy_grows_with_size_and_meets_the_streaming_bandwidth():
    timer = CudaTimer("cuda")
    floor = ceilings.SameTrafficCopy(timer, "cuda")
    streaming_gbps = ceilings.measure("cuda").copy_gbps
    small, large = floor.ms(1 << 20), floor.ms(1 << 31)
    print(f"same-traffic copy: 1 MiB {small * 1e3:.2f} us, 2 GiB {large * 1e3:.1f} us; "
          f"streaming {streaming_gbps:.0f} GB/s")
    assert 0 < small < large
    # 2 GiB moved is streaming: within 10% of the 1 GiB copy's bandwidth
    assert (1 << 31) / large / 1e6 == pytest.approx(streaming_gbps, rel=0.10)
    # a 1 MiB op cannot stream: its floor is far below the bandwidth (fixed cost dominates)
    assert (1 << 20) / small / 1e6 < 0.5 * streaming_gbps
    assert floor.ms(float(1 << 20)) == small  # cached per size (cost models give floats): one copy per size


def test_same_traffic_floor_is_not_slowed_by_an_odd_byte_count():
    """An op's exact bytes (33.6 MB: no whole 4 KiB) must not make its floor slower than the copy of a
    larger, MiB-aligned size: torch's copy of an odd count ran ~3 us (20%) slower (lesson harness 15)."""
    floor = ceilings.SameTrafficCopy(CudaTimer("cuda"), "cuda")
    odd, aligned = floor.ms(33_600_000), floor.ms((1 << 25) + (1 << 20))
    print(f"same-traffic copy: 33.6 MB {odd * 1e3:.2f} us, 34.6 MB (MiB-aligned) {aligned * 1e3:.2f} us")
    assert odd <= 1.05 * aligned
