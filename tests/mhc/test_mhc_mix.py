"""mHC pass 1 (v4, tensor-core mixes): compiles for sm_90a and sm_100a at the Pro and Flash widths
for prefill, decode, a single token and ragged T without local memory; on a GPU (marked gpu),
the [T, splits, n_mix + 1] partials against the fp64 product at tile edges (T not a multiple of
the CTA's tokens, one K chunk of 32 columns, many chunks)."""

from __future__ import annotations

import cutlass
import pytest
import torch
from cutlass import cute
from cutlass.cute.runtime import make_fake_compact_tensor

from dsv4bench.compile.cache import describe
from kernels.common import compile_kernel, fake_rowmajor
from kernels.mhc.family import N_MIX
from kernels.mhc.mix import HcMixKernel, pick_tiling


def compile_mix(op: str, d: int, t: int, arch: str):
    k = 4 * d
    tm, chunk = pick_tiling(k, t)
    mix = HcMixKernel(N_MIX[op], k, chunk, tm)
    rows = cute.sym_int()
    part = make_fake_compact_tensor(
        cutlass.Float32, (rows, mix.splits, mix.n_mix + 1), stride_order=(2, 1, 0), assumed_align=4
    )
    x, fn = fake_rowmajor("bf16", (rows, k)), fake_rowmajor("fp32", (mix.n_mix, k))
    return mix, compile_kernel(mix, x, fn, part, arch=arch)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("t", [1, 37, 64, 4096, 4097])
@pytest.mark.parametrize("d", [4096, 7168])
@pytest.mark.parametrize("op", ["pre", "head"])
def test_mix_v4_compiles_without_spills(op, d, t, arch):
    mix, compiled = compile_mix(op, d, t, arch)
    info = describe(compiled, 0.0, "miss")
    print(op, d, t, arch, f"tm={mix.tm} chunk={mix.chunk}", info)
    assert info.cubin_bytes and info.cubin_bytes > 1000
    assert 0 < info.registers <= 128  # 4 CTAs of 128 threads per SM
    assert info.local_bytes == 0, f"{info.local_bytes} B of local memory (spills)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "op, d, t",
    [("pre", 7168, 1), ("pre", 7168, 37), ("pre", 7168, 65), ("pre", 7168, 4097), ("pre", 4096, 129),
     ("pre", 8, 3), ("pre", 1000, 130), ("head", 7168, 37), ("head", 4096, 4097), ("head", 1000, 64)],
)
def test_mix_v4_partials_on_gpu(op, d, t):
    """Σ_s part[t, s, m] against the fp64 x·fnᵀ (within 2^-14 of Σ|x·fn|, the bf16 split's class)
    and Σ_s part[t, s, n_mix] against Σx²; the rows past T stay untouched."""
    major, minor = torch.cuda.get_device_capability()
    mix, compiled = compile_mix(op, d, t, f"sm_{major}{minor}a")
    gen = torch.Generator().manual_seed(t + d)
    k = 4 * d
    x = (torch.randn(t, k, generator=gen) + 0.25).bfloat16()
    fn = torch.randn(mix.n_mix, k, generator=gen) * k**-0.5
    slab = torch.full((t + 1, mix.splits, mix.n_mix + 1), 7.0, device="cuda")
    part = slab[:t]
    compiled(x.cuda(), fn.cuda(), part)
    torch.cuda.synchronize()
    assert bool((slab[t] == 7.0).all()), "store past the last token"
    got = part.sum(1).double().cpu()
    xd = x.double()
    exact = xd @ fn.double().T
    scale = xd.abs() @ fn.double().abs().T
    assert ((got[:, : mix.n_mix] - exact).abs() <= 2.0**-14 * scale + 1e-30).all()
    sq = (xd * xd).sum(1)
    assert ((got[:, mix.n_mix] - sq).abs() <= 1e-4 * sq).all()
