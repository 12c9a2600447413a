"""Every family's eager torch baseline computes the family's math: it passes against the oracle on
the CPU for a small production case (the baselines are what our kernels are timed against)."""

from __future__ import annotations

import pytest

from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, families, get_impl
from dsv4bench.core.evaluate import CaseData

SMALL_BYTES = 64 << 20
# families without a torch.compile baseline, and why
NO_TORCH_COMPILE = {"moe": "the layout's sort, bincount and data-dependent gathers break the graph "
                           "(kernels/moe/peers.py); its peers are DeepGEMM, torch._grouped_mm and the eager loop"}


def small_case(family):
    cases = [c for c in family.cases(SweepOptions(examples=0, seed=1)) if family.cost(c).bytes <= SMALL_BYTES]
    return min(cases, key=lambda c: family.cost(c).bytes)


@pytest.mark.parametrize("name", sorted(n for n in families() if n != "fmha"))
def test_eager_baseline_matches_the_oracle_on_cpu(name):
    family = families()[name]
    case = small_case(family)
    impl = get_impl(name, "torch")
    data = CaseData(family, case, "cpu")
    result = impl.run(case, data.inputs, family.alloc_outputs(case, "cpu"), None)
    ok, metrics = compare_outputs(result, data.oracle, data.lowprec, lambda n: family.tolerance_for(case, n))
    assert ok, f"{case}: " + "; ".join(m.summary() for m in metrics.values())
    if name not in NO_TORCH_COMPILE:
        assert get_impl(name, "torch_compile").backend == "torch_compile"


def test_torch_compile_keeps_compiling_past_dynamos_default_recompile_limit():
    """A sweep compiles one function for many shapes; past dynamo's default limit (8) it would
    silently fall back to running the function eagerly and unfused. Every shape must get a graph."""
    import torch
    from torch._dynamo.utils import counters

    from dsv4bench.core.torch_impls import _compile

    torch._dynamo.reset()
    counters.clear()

    def scaled_sum(x):
        return (x * 2.0).sum(-1)

    compiled = _compile(scaled_sum, backend="eager")  # the graph capture is what is tested
    shapes = [(n, 3) for n in range(1, 21)]
    for shape in shapes:
        x = torch.randn(shape)
        assert torch.equal(compiled(x), scaled_sum(x))
    assert counters["stats"]["unique_graphs"] == len(shapes)
