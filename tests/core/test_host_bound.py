"""A bench record is flagged host-bound when its event-timed median is mostly the GPU waiting for the
host (the gemm rule's Python search inside the timed call read 50 µs for a 7 µs kernel)."""

from dsv4bench.core.worker import host_bound


def test_host_bound_flags_medians_far_above_the_kernels():
    assert host_bound(50.8, 7.3)  # the v2 decode run before the rule was cached
    assert not host_bound(9.9, 7.0)  # launch latency on a small kernel is not host-bound
    assert not host_bound(980.0, 977.9)
    assert not host_bound(50.0, None) and not host_bound(50.0, 0.0)  # no CUPTI split: no verdict
