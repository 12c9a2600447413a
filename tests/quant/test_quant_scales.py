"""The FP8 quant kernel as the GEMM's front end (kernels/gemm/quant_gemm.py): rows wider than one
CTA (the grouped wo_a input, G x 4096) split into column tiles, and scales written as fp32 values
in any layout (the GEMM's MN-major columns) besides the ue8m0 bytes. CPU: the tiling and the
compile; GPU: bit-exact against the oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsv4bench.core.case import Case
from kernels.quant.quant import VEC, QuantConfig, QuantKernel
from sweeps import quant as qspace


@given(blocks=st.integers(1, 1024), block=st.sampled_from([64, 128]))
def test_wide_rows_split_into_column_tiles_of_whole_blocks(blocks, block):
    n = blocks * block
    cfg = QuantConfig.make("fp8", n, block)
    cols = cfg.tiler(VEC)[1]
    assert cols % block == 0  # no block straddles two CTAs
    assert cfg.col_tiles * cols >= n > (cfg.col_tiles - 1) * cols  # every column once, no idle tile
    assert cfg.vecs_per_thread <= 8 and cfg.threads <= 1024
    assert (cfg.col_tiles == 1) == (n <= 16384)  # what fit one CTA before keeps its single tile


def _fakes(n: int, scale_type, mn_major: bool):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    rows = cute.sym_int()
    x = make_fake_tensor(cutlass.BFloat16, (rows, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    q = make_fake_compact_tensor(cutlass.Uint8, (rows, n), stride_order=(1, 0), assumed_align=16)
    stride = (1, cute.sym_int64(divisibility=4)) if mn_major else (cute.sym_int64(), 1)
    s = make_fake_tensor(scale_type, (rows, n // 128), stride, assumed_align=4)
    return x, q, s


@pytest.mark.parametrize("n", [4096, 65536])
def test_fp32_mn_major_scales_compile_without_local_memory(n):
    import cutlass

    from dsv4bench.compile.artifacts import artifact
    from dsv4bench.compile.cubin import parse_cubin
    from kernels.common import compile_kernel

    info = parse_cubin(artifact(compile_kernel(QuantKernel("fp8", n, 128), *_fakes(n, cutlass.Float32, True),
                                               arch="sm_90a")))
    assert info.local_bytes == 0


def test_scale_types_other_than_ue8m0_and_fp32_are_refused():
    import cutlass

    from kernels.common import compile_kernel

    with pytest.raises(ValueError, match=r"Uint8 \(ue8m0\) or Float32"):
        compile_kernel(QuantKernel("fp8", 256, 128), *_fakes(256, cutlass.Int32, False), arch="sm_90a")


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(3, 65536), (257, 32768), (64, 16512), (1, 16384)])
def test_wide_rows_bit_exact(m, n, gpu_check):
    gpu_check(Case("quant", qspace.fp8(m, n), 5))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(1, 1024), (5, 4096), (130, 7168), (33, 65536)])
def test_fp32_mn_major_scales_are_the_ue8m0_values(m, n):
    """Codes as the oracle's, scales 2^(e - 127) in columns of ld = m rounded up to 4; the padding
    rows of each column are left as they were."""
    import cutlass

    from kernels.common import compile_kernel
    from oracles.quant import fp8_block_quant

    major, minor = torch.cuda.get_device_capability()
    compiled = compile_kernel(QuantKernel("fp8", n, 128), *_fakes(n, cutlass.Float32, True),
                              arch=f"sm_{major}{minor}a")
    gen = torch.Generator().manual_seed(m)
    x = (torch.randn(m, n, generator=gen) * torch.exp2(torch.empty(m, 1).uniform_(-10, 10, generator=gen)))
    xb = x.bfloat16()
    ld = -(-m // 4) * 4
    codes = torch.full((m, n), 0xA5, dtype=torch.uint8, device="cuda")
    buf = torch.full((n // 128, ld), float("nan"), device="cuda")
    compiled(xb.cuda(), codes, buf.t()[:m])
    torch.cuda.synchronize()
    ref_codes, ref_scales = fp8_block_quant(xb, 128)
    assert torch.equal(codes.cpu(), ref_codes.view(torch.uint8))
    assert torch.equal(buf.t()[:m].cpu(), ref_scales)
    assert buf.t()[m:].isnan().all(), "a scale was written past row m"
