"""Test-wide setup: `gpu` tests skip cleanly without CUDA; hypothesis never uses deadlines."""

from __future__ import annotations

import pytest
from hypothesis import settings

settings.register_profile("dsv4bench", deadline=None, max_examples=25, print_blob=True)
settings.load_profile("dsv4bench")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
