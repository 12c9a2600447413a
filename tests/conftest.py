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
    """Compiled kernels, their signing key and synthetic checkpoints go to a throwaway dir, never
    ~/.cache or ~/.config."""
    os.environ["DSV4BENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("dsv4bench-cache"))
    os.environ["DSV4BENCH_CACHE_KEY"] = str(tmp_path_factory.mktemp("dsv4bench-key") / "cache.key")


@pytest.fixture(autouse=True)
def private_regressions_dir(tmp_path_factory, monkeypatch):
    """Sweeps append failing cases to sweeps/regressions/<family>.jsonl and replay them first: every
    test (and the CLIs it spawns) gets a fresh directory instead, so the suite never dirties the
    repo and no test replays another's failures."""
    monkeypatch.setenv("DSV4BENCH_REGRESSIONS_DIR", str(tmp_path_factory.mktemp("regressions")))


@pytest.fixture(autouse=True)
def release_gpu_memory_between_workers(request):
    """Under pytest-xdist several processes share one GPU: each hands its cached-but-free blocks back
    after a GPU test, or one worker's idle cache starves another's next large case (CUDA OOM)."""
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and "gpu" in request.keywords:
        import torch

        torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def gpu_check():
    """Every GPU test's run-and-compare: `gpu_check(case, impl=None)` compiles (cached for the session)
    and evaluates the impl (default: the family's `cutedsl`) through the one evaluation path
    (dsv4bench/core/evaluate.py: poisoned outputs between canary pads, inputs checked unchanged, the
    oracle comparison), asserts it passed and returns the Outcome."""
    import torch

    from dsv4bench.compile.cache import CompileCache
    from dsv4bench.core.evaluate import evaluate
    from dsv4bench.core.registry import get_family, get_impl

    cache = CompileCache(use_disk=False)
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"

    def check(case, impl=None, expect_pass: bool = True):
        family = get_family(case.family)
        impl = impl or get_impl(case.family, "cutedsl")
        print(case, impl.name, arch)
        assert impl.supports(case, arch) is None, impl.supports(case, arch)
        compiled = cache.get(impl, case, arch)[0] if impl.compiles else None
        outcome = evaluate(family, impl, case, compiled, device="cuda")
        print(outcome.status, outcome.reason)
        if expect_pass:
            assert outcome.passed, f"{case}: {outcome.status}: {outcome.reason}"
        return outcome

    return check
