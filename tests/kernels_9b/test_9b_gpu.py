"""Router, quant and sampler kernels against the FP32 oracle on a GPU: every production case plus
hypothesis draws (ragged rows, single rows, tile boundaries, odd widths). Codes, scales, expert-id
sets and sampled tokens must match bit for bit; router weights by the BENCHMARKING.md rule.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.compile.cache import CompileCache
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from dsv4bench.core.worker import CaseData, poison

pytestmark = [pytest.mark.gpu]

FAMILIES = ("quant", "router", "sampler")
CASES = [c for f in FAMILIES for c in get_family(f).cases(SweepOptions(examples=10, seed=9))]
_cache = CompileCache()


def with_canary_rows(out: dict) -> dict:
    """Each output becomes the leading rows of a poisoned buffer one row longer; returns the pads."""
    pads = {}
    for name, t in out.items():
        big = torch.empty((t.shape[0] + 1, *t.shape[1:]), dtype=t.dtype, device=t.device)
        poison({name: big})
        out[name], pads[name] = big[:-1], big[-1]
    return pads


def untouched(pad: torch.Tensor) -> bool:
    return bool(pad.isnan().all()) if pad.dtype.is_floating_point else bool((pad == torch.full_like(pad, -7)).all())


@pytest.mark.parametrize("case", CASES, ids=[f"{c.id}-{c.shape_str().replace(' ', ',')}" for c in CASES])
def test_cutedsl_matches_oracle(case):
    fam, impl = get_family(case.family), get_impl(case.family, "cutedsl")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    assert impl.supports(case, arch) is None
    compiled, _ = _cache.get(impl, case, arch)
    data = CaseData(fam, case, "cuda")
    out = fam.alloc_outputs(case, "cuda")
    pads = with_canary_rows(out)
    before = {k: v.clone() for k, v in data.inputs.items()}
    res = impl.run(case, data.inputs, out, compiled)
    torch.cuda.synchronize()
    ok, metrics = compare_outputs(res, data.oracle, data.lowprec, lambda n: fam.tolerance_for(case, n))
    assert ok, {k: m.summary() for k, m in metrics.items()}
    assert all(torch.equal(v, before[k]) for k, v in data.inputs.items()), "an input was modified"
    assert all(untouched(p) for p in pads.values()), "a store ran past the end of an output"
