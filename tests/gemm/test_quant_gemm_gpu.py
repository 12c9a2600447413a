"""quant + gemm on the H100: through the family's evaluation path (poisoned outputs, the oracle
rule on x_qdq . W^T), and bit for bit the GEMM of the reference's act_quant(x) (the codes and
scales the quant kernel writes are the oracle's, so the GEMM sees the same operands)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dsv4bench.core.case import Case
from kernels.gemm.config import choose_config
from kernels.gemm.glue import compile_gemm, draw_operands, mn_major, run_gemm
from kernels.gemm.quant_gemm import compile_quant_gemm, quant_operands, run_quant_gemm
from oracles.quant import fp8_block_quant
from sweeps.gemm import QUANT_GEMM

pytestmark = pytest.mark.gpu

SHAPES = [  # (m, n, k, groups): decode, ragged and non-square, multi-tile, grouped wo_a (32768 / 65536 wide)
    (1, 1024, 4096, 1), (8, 1536, 7168, 1), (200, 1000, 1024, 1), (4097, 4104, 1024, 1), (129, 136, 384, 1),
    (64, 7168, 16384, 1), (1000, 8192, 256, 1), (3, 8192, 4096, 8), (300, 16384, 4096, 16), (77, 768, 640, 3),
]


@pytest.mark.parametrize("m,n,k,groups", SHAPES)
def test_quant_gemm_passes_the_oracle_rule(m, n, k, groups, gpu_check):
    gpu_check(Case("gemm", {"m": m, "n": n, "k": k, "groups": groups, "layer": "test", "op": QUANT_GEMM}, 7))


@pytest.mark.parametrize("m,n,k,groups", [(5, 1024, 4096, 1), (4096, 1536, 7168, 1), (257, 8192, 4096, 8)])
def test_quant_gemm_is_the_gemm_of_the_reference_act_quant(m, n, k, groups):
    x, w, sw = (t.cuda() for t in draw_operands(m, n, k, 11, groups))
    xb = x.bfloat16()
    cfg = choose_config(m, n, k, groups=groups)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    codes, sa = quant_operands(xb, w, sw, y, groups)
    run_quant_gemm(compile_quant_gemm(cfg, groups * k), cfg, xb, codes, sa, w, sw, y, groups)
    xq, sa_ref = (t.cuda() for t in fp8_block_quant(xb.cpu(), 128))  # the oracle's act_quant, on the CPU
    ref = torch.empty_like(y)
    run_gemm(compile_gemm(cfg), cfg, xq, mn_major(sa_ref), w, sw, ref, groups)
    torch.cuda.synchronize()
    assert torch.equal(codes, xq.view(torch.uint8))
    assert torch.equal(sa, sa_ref)
    if cfg.split_k == 1:  # split-K sums its slices with atomics, in no fixed order
        assert torch.equal(y, ref)
    else:
        torch.testing.assert_close(y, ref, rtol=2**-7, atol=0)


@pytest.mark.parametrize("m,n,k,groups", [(1, 4096, 8192, 1), (8, 512, 4096, 1), (64, 7168, 16384, 1),
                                          (200, 1000, 1024, 1), (3, 8192, 4096, 8), (4096, 1536, 7168, 1),
                                          (256, 512, 4096, 1), (4096, 7168, 4096, 1)])
def test_pdl_quant_gemm_is_the_plain_one(m, n, k, groups):
    """The GEMM launched with PDL after a triggering quant kernel (GemmConfig.pdl: the first ring-full of
    weights loads before griddepcontrol.wait, x after) gives the plain pair's answer, bit for bit where the
    sum has a fixed order (no split, or a split-K cluster). The codes and scales are poisoned before each
    PDL call: a GEMM reading x before the quant kernel wrote it would see the poison."""
    cfg = choose_config(m, n, k, groups=groups)
    pdl = replace(cfg, pdl=True)
    plain_kernel, pdl_kernel = compile_quant_gemm(cfg, groups * k), compile_quant_gemm(pdl, groups * k)
    for seed in (1, 2):
        x, w, sw = (t.cuda() for t in draw_operands(m, n, k, seed, groups))
        xb = x.bfloat16()
        ref = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        codes, sa = quant_operands(xb, w, sw, ref, groups)
        run_quant_gemm(plain_kernel, cfg, xb, codes, sa, w, sw, ref, groups)
        y = torch.full_like(ref, float("nan"))
        codes.fill_(0x7E)  # e4m3 448, the largest code
        sa.fill_(2.0 ** 20)
        run_quant_gemm(pdl_kernel, pdl, xb, codes, sa, w, sw, y, groups)
        torch.cuda.synchronize()
        if cfg.split_k == 1 or cfg.cluster_k:
            assert torch.equal(y, ref), (m, n, k, pdl)
        else:
            torch.testing.assert_close(y, ref, rtol=2**-7, atol=0)
