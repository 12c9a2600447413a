"""mHC pass 1 (v4) numerics on a CPU: the mixes as x·bf16(fn) + x·bf16(fn − bf16(fn)) with fp32
accumulation (what the tensor-core kernel computes) against the fp64 product, and against the
family's low-precision reference (fn rounded to TF32), at the production widths."""

from __future__ import annotations

import pytest
import torch

from kernels.mhc.family import N_MIX, tf32_round


def split_bf16(fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = fn.bfloat16()
    lo = (fn - hi.float()).bfloat16()
    return hi, lo


@pytest.mark.parametrize("d", [4096, 7168])
@pytest.mark.parametrize("op", ["pre", "head"])
def test_bf16_split_of_fn_beats_tf32(op, d):
    gen = torch.Generator().manual_seed(d + len(op))
    k, n_mix = 4 * d, N_MIX[op]
    x = (torch.randn(64, k, generator=gen) + 0.25).bfloat16().float()
    fn = torch.randn(n_mix, k, generator=gen) * k**-0.5
    hi, lo = split_bf16(fn)
    # the split: |fn − hi − lo| <= 2^-16·|fn| elementwise (hi: 2^-9 relative, lo: 2^-9 of |fn − hi|)
    resid = (fn.double() - hi.double() - lo.double()).abs()
    assert (resid <= 2.0**-16 * fn.double().abs()).all()
    exact = x.double() @ fn.double().T
    # the kernel: bf16 products exact in fp32, accumulated in fp32 (chunked like the split over K)
    ours = sum(
        x[:, c : c + 1024] @ hi.float()[:, c : c + 1024].T + x[:, c : c + 1024] @ lo.float()[:, c : c + 1024].T
        for c in range(0, k, 1024)
    )
    tf32 = x @ tf32_round(fn).T
    err = (ours.double() - exact).abs().max().item()
    ref = (tf32.double() - exact).abs().max().item()
    # the analytic bound: Σ|x·fn|·(2^-16 + K·2^-24) ; and far inside the family's rule (2·ref)
    bound = ((x.double().abs() @ fn.double().abs().T) * (2.0**-16 + k * 2.0**-24)).max().item()
    assert err <= bound
    assert err <= 0.25 * ref, (err, ref)
