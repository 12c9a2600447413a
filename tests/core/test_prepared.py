"""kernels.common.Prepared: a peer's derived operand is reused only for the very same, unmodified tensors."""

from __future__ import annotations

import torch

from kernels.common import Prepared


def test_derived_value_is_reused_then_remade_on_a_write_or_another_tensor():
    cache, made = Prepared(), []

    def make(t):
        made.append(1)
        return t * 2

    a = torch.arange(4.0)
    first = cache.get((a,), lambda: make(a))
    assert cache.get((a,), lambda: make(a)) is first and len(made) == 1
    a.add_(1)  # written to: a new version
    assert torch.equal(cache.get((a,), lambda: make(a)), (torch.arange(4.0) + 1) * 2) and len(made) == 2
    b = a.clone()  # equal values, another tensor
    cache.get((b,), lambda: make(b))
    assert len(made) == 3


def test_a_new_tensor_at_a_freed_ones_address_is_not_served_the_old_value():
    cache = Prepared()
    a = torch.zeros(1024)
    ptr = a.data_ptr()
    cache.get((a,), lambda: "from a")
    del a
    b = torch.ones(1024)  # the allocator may well hand back the same storage
    got = cache.get((b,), lambda: "from b")
    assert got == "from b", f"stale value for a tensor at {b.data_ptr() == ptr and 'the same' or 'another'} address"


def test_several_sources_are_held_up_to_the_size():
    cache = Prepared(size=2)
    ts = [torch.full((3,), float(i)) for i in range(3)]
    vals = [cache.get((t,), lambda t=t: t.sum()) for t in ts]
    assert cache.get((ts[2],), lambda: "remade") is vals[2]  # still held
    assert cache.get((ts[0],), lambda: "remade") == "remade"  # the oldest went


def test_a_value_is_dropped_when_a_source_is_freed():
    """A sweep's next case must not hold the last case's derived weights beside its own: once a source is freed,
    the values made from it go (a replaced entry's late callback does not drop its successor)."""
    import weakref

    weights = Prepared(size=2)
    old, kept = torch.ones(4), torch.ones(3)
    value = weights.get((old, kept), lambda: torch.zeros(8))
    alive = weakref.ref(value)
    del value
    assert alive() is not None  # held while its sources live
    del old
    assert alive() is None and not weights._entries
    first = weights.get((kept,), lambda: torch.zeros(1))
    kept.add_(1)  # written: remade under the same key
    second = weights.get((kept,), lambda: torch.zeros(2))
    assert second is not first and weights.get((kept,), lambda: "remade") is second
