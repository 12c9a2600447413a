"""quant + gemm, the op a model calls: bf16 activations in, y = act_quant(x) . W^T in bf16 out.

x bf16 [M, G*K] -> the quant kernel (kernels/quant/quant.py: e4m3 per 128 columns with the ue8m0
rule of spec §2.3, bit-exact with the reference's act_quant) writes the codes [M, G*K] and the
scales, the latter straight in the GEMM's operand layout: fp32 values 2^(e - 127) (exact) in
MN-major columns of ld = M rounded up to 4 (`glue.mn_major_buffer`). So nothing converts or
transposes the scales between the two kernels; the codes make one trip through DRAM (written,
then read by the GEMM's TMA). One jitted function launches both (one host call, one compiled
artifact), on one stream.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

from kernels.common import compile_kernel, sm_count
from kernels.gemm.gemm_sm90 import Fp8GemmSm90
from kernels.gemm.glue import (
    check_cluster_round, check_operands, check_pairs, fake_args, mn_major_buffer, scales_for_tma, workspace,
)
from kernels.gemm.tiling import KBLOCK, GemmConfig
from kernels.quant.quant import QuantKernel


class QuantGemm:
    """Compile-time: the GEMM's tile configuration and the quantised width G*K."""

    def __init__(self, cfg: GemmConfig, width: int):
        # cfg.pdl: the GEMM launches while the quant kernel runs and streams its first weights meanwhile
        self.quant = QuantKernel("fp8", width, KBLOCK, trigger=cfg.pdl)
        self.gemm = Fp8GemmSm90(cfg)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mA: cute.Tensor, mSA: cute.Tensor, mB: cute.Tensor,
                 mSB: cute.Tensor, mC: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor,
                 n_group: cutlass.Int32, n_ctas: cutlass.Int32, stream):
        # mQ (uint8, what the quant kernel stores) and mA (e4m3, what the GEMM loads) are one buffer
        self.quant(mX, mQ, mSA, stream)
        self.gemm(mA, mSA, mB, mSB, mC, mWork, mCount, n_group, n_ctas, stream)


def compile_quant_gemm(cfg: GemmConfig, width: int, arch: str = "sm_90a"):
    """Compile quant + gemm for rows of `width` = G*K activations (no GPU needed)."""
    rows = cute.sym_int()
    x = make_fake_tensor(cutlass.BFloat16, (rows, width), (width, 1), assumed_align=16)
    codes = make_fake_compact_tensor(cutlass.Uint8, (rows, width), stride_order=(1, 0), assumed_align=16)
    return compile_kernel(QuantGemm(cfg, width), x, codes, *fake_args(cfg), arch=arch)


def quant_operands(x, w, sw, out=None, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Check x (bf16 [M, G*K], contiguous, 16-byte aligned) and make the buffers the quant kernel
    fills: codes uint8 [M, G*K] and sa fp32 [M, G*K/128] MN-major. The codes stand for x in
    `check_operands`, which checks the rest (bad input -> ValueError naming the tensor)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("gemm: x must be a 2-D tensor")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"gemm: x must be bfloat16 (quant+gemm quantises it), got {x.dtype}")
    if not x.is_contiguous() or x.data_ptr() % 16:
        raise ValueError(f"gemm: x must be contiguous and 16-byte aligned, got strides {tuple(x.stride())}")
    m, width = x.shape
    codes = torch.empty(m, width, dtype=torch.uint8, device=x.device)
    sa = mn_major_buffer(m, width // KBLOCK, x.device)
    check_operands(codes.view(torch.float8_e4m3fn), sa, w, sw, out, groups)
    return codes, sa


def run_quant_gemm(compiled, cfg: GemmConfig, x, codes, sa, w, sw, out, groups: int = 1,
                   n_ctas: int | None = None) -> torch.Tensor:
    """One call of a `compile_quant_gemm` kernel on `quant_operands`' buffers."""
    m, n = x.shape[0], w.shape[0]
    check_pairs(cfg, n, groups)
    ctas = n_ctas or sm_count(x.device)
    check_cluster_round(cfg, m, n, ctas)
    sa, sw = scales_for_tma(sa, sw, groups, cfg)  # x_box: the quant kernel writes sa's first M rows (x's bound)
    work, count = workspace(cfg, m, n, x.device)
    compiled(x, codes, codes.view(torch.float8_e4m3fn), sa, w, sw, out, work, count, n // groups, ctas)
    return out
