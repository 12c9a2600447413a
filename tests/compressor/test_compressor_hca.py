"""The split HCA kernel (several CTAs per entry, merged by the last-arriving CTA): its parameters
on a CPU, and on a GPU every split / group choice against the FP32 oracle with fresh random
inputs, run-to-run bit-identity, the counters left at zero, and a broken merge that the check catches."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_family
from dsv4bench.core.evaluate import poison
from kernels.common import compile_kernel
from kernels.compressor.family import entries, fake_args, kernel_for, split
from kernels.compressor.hca import STATE, HcaKernel
from tests.compressor.fp8_grid import off_grid

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("splits, groups", [(3, 1), (8, 32), (256, 1)])
def test_hca_rejects_bad_splits(splits, groups):
    with pytest.raises(ValueError):
        HcaKernel(128, 512, splits=splits, groups=groups)


def test_sequences_shorter_than_one_block_are_refused_with_a_reason():
    """S < 128: no complete HCA block, so no entry and no launch (a clear reason, not a crash)."""
    from kernels.compressor.family import CompressorCuteDSL

    case = Case("compressor", {"m": 128, "b": 2, "s": 127, "d": 512, "dtype": "bf16"})
    assert entries(case) == 0
    assert CompressorCuteDSL().supports(case, "sm_90a") == "no complete block"


def _setup(b: int, s: int, splits: int, groups: int):
    case = Case("compressor", {"m": 128, "b": b, "s": s, "d": 512, "dtype": "bf16"})
    fam = get_family("compressor")
    seed = random.randrange(1 << 31)  # fresh inputs every run; printed for a replay
    print(f"seed {seed}")
    x = fam.make_inputs(case, torch.Generator().manual_seed(seed), "cuda")
    major, minor = torch.cuda.get_device_capability()
    kernel = compile_kernel(kernel_for(case, splits=splits, groups=groups), *fake_args(case, splits),
                            arch=f"sm_{major}{minor}a")
    part = torch.empty(b, entries(case), splits, STATE, 512, device="cuda")
    count = torch.zeros(b * entries(case), dtype=torch.int32, device="cuda")
    out = fam.alloc_outputs(case, "cuda")
    return case, fam, x, kernel, part, count, out


def _run(x, kernel, part, count, out):
    poison(out)
    kernel(x["kv"], x["score"], x["norm_w"], x["table"], out["out"], part, count)
    torch.cuda.synchronize()
    return split(out["out"].clone())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("b, s", [(1, 16384), (3, 5 * 128 + 17)])
@pytest.mark.parametrize("splits, groups", [(1, 4), (4, 2), (8, 1), (16, 1)])
def test_hca_split_matches_fp32_oracle(b, s, splits, groups):
    case, fam, x, kernel, part, count, out = _setup(b, s, splits, groups)
    first = _run(x, kernel, part, count, out)
    ok, metrics = compare_outputs(first, fam.oracle(case, x), fam.lowprec(case, x),
                                  lambda n: fam.tolerance_for(case, n))
    print("; ".join(f"{k}: {m.summary()}" for k, m in metrics.items()))
    assert ok
    assert off_grid(first["nope"]) == 0
    second = _run(x, kernel, part, count, out)
    assert all(torch.equal(first[k], second[k]) for k in first), "the merge is not run-to-run identical"
    assert bool((count == 0).all()), "the merging CTA did not reset its entry's counter"


@pytest.mark.gpu
@needs_gpu
def test_hca_merge_before_all_states_fails():
    """Counters started at splits - 1: the first CTA to arrive merges, before (most of) the other
    seven states are written (scratch NaN). Started at 1 it was the 7th, racing the 8th's store:
    the check passed on the H100."""
    case, fam, x, kernel, part, count, out = _setup(1, 16384, 8, 1)
    part.fill_(float("nan"))
    count.fill_(7)
    bad = _run(x, kernel, part, count, out)
    assert not compare_outputs(bad, fam.oracle(case, x), fam.lowprec(case, x), lambda n: fam.tolerance_for(case, n))[0]
