"""The `deepgemm-kernels` layer peer on a GPU (marked `gpu`): our dispatch + DeepGEMM's grouped FP8 GEMMs +
the compiled activation + our combine, through the one evaluation path (poisoned outputs, canaries, the
tolerance rule), on a small masked and a small contiguous case (tests/moe/test_moe_peers_cpu.py's)."""

from __future__ import annotations

import pytest

from dsv4bench.core.registry import get_impl
from tests.moe.test_moe_peers_cpu import CASES

pytestmark = pytest.mark.gpu

SMALL = [CASES[1], CASES[3]]  # masked (hash: a token on one expert twice), contiguous (sparse: empty experts)


@pytest.mark.parametrize("case", SMALL, ids=[c.id for c in SMALL])
def test_peer_passes_the_rule(case, gpu_check):
    peer = get_impl("moe", "deepgemm-kernels")
    if peer.available():
        pytest.skip(peer.available())
    gpu_check(case, peer)
