"""Test-wide setup: `gpu` tests skip cleanly without CUDA; hypothesis never uses deadlines."""

from __future__ import annotations

import os

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


@pytest.fixture(autouse=True, scope="session")
def isolated_user_cache(tmp_path_factory):
    """Compiled kernels and synthetic checkpoints go to a throwaway dir, never ~/.cache."""
    os.environ["DSV4BENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("dsv4bench-cache"))


@pytest.fixture(autouse=True)
def private_regressions_dir(tmp_path_factory, monkeypatch):
    """Sweeps append failing cases to sweeps/regressions/<family>.jsonl and replay them first: every
    test (and the CLIs it spawns) gets a fresh directory instead, so the suite never dirties the
    repo and no test replays another's failures."""
    monkeypatch.setenv("DSV4BENCH_REGRESSIONS_DIR", str(tmp_path_factory.mktemp("regressions")))
