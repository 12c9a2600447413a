"""The issue-9a CuTeDSL kernels (rope, mhc, compressor) against the FP32 oracle on a GPU: every
production case plus hypothesis draws, outputs between canary pads, inputs checked unchanged;
the compressor's NoPE values exactly on the FP8 grid and equal to the oracle's codes but for
rounding-midpoint flips. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.compile.cache import CompileCache
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from dsv4bench.core.worker import CaseData, poison
from tests.compressor.fp8_grid import off_grid

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FAMILIES = ("rope", "mhc", "compressor")
CASES = [c for f in FAMILIES for c in get_family(f).cases(SweepOptions(examples=8, seed=9))]
PAD = 4096
CACHE = CompileCache()


def padded(out: dict) -> tuple[dict, list]:
    """Each output placed between canary pads (7.0) inside one slab; returns the views and slabs."""
    views, slabs = {}, []
    for name, t in out.items():
        slab = torch.full((t.numel() + 2 * PAD,), 7.0, dtype=t.dtype, device=t.device)
        views[name] = slab[PAD:PAD + t.numel()].view(t.shape)
        slabs.append(slab)
    return views, slabs


def run_case(case):
    fam, impl = get_family(case.family), get_impl(case.family, "cutedsl")
    major, minor = torch.cuda.get_device_capability()
    compiled, _ = CACHE.get(impl, case, f"sm_{major}{minor}a")
    data = CaseData(fam, case, "cuda")
    before = {k: v.clone() for k, v in data.inputs.items()}
    out, slabs = padded(fam.alloc_outputs(case, "cuda"))
    poison(out)
    result = impl.run(case, data.inputs, out, compiled)
    torch.cuda.synchronize()
    for k, v in data.inputs.items():
        assert torch.equal(v, before[k]), f"the kernel wrote into input {k}"
    for slab in slabs:
        assert bool((slab[:PAD] == 7).all() and (slab[-PAD:] == 7).all()), "store out of bounds"
    return fam, data, result


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cutedsl_matches_fp32_oracle(case):
    print(case)
    if get_impl(case.family, "cutedsl").supports(case):
        pytest.skip(get_impl(case.family, "cutedsl").supports(case))
    fam, data, result = run_case(case)
    ok, metrics = compare_outputs(result, data.oracle, data.lowprec, lambda n: fam.tolerance_for(case, n))
    summary = "; ".join(f"{k}: {m.summary()}" for k, m in metrics.items())
    print(summary)
    assert ok, f"{case}: {summary}"
    if case.family == "compressor":
        nope = result["nope"]
        assert off_grid(nope) == 0, "NoPE values off the FP8 grid"
        flips = float((nope != data.oracle["nope"].to(nope.dtype)).float().mean())
        print(f"NoPE values differing from the oracle's codes: {flips:.2e}")
        assert flips < 2e-3


def test_poisoned_output_fails_the_rule():
    """An unwritten output fails (guards against a test that cannot fail)."""
    case = next(c for c in CASES if c.family == "mhc" and c["op"] == "pre")
    fam = get_family("mhc")
    data = CaseData(fam, case, "cuda")
    bad = fam.alloc_outputs(case, "cuda")
    poison(bad)
    assert not compare_outputs(bad, data.oracle, data.lowprec, lambda n: fam.tolerance_for(case, n))[0]
