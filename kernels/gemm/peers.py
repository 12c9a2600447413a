"""Peers of the gemm family, each behind its own import: DeepGEMM fp8_gemm_nt (fp8_einsum for the
grouped wo_a), cuBLASLt blockwise FP8 through torch._scaled_mm, and torch (eager and compiled) bf16
matmul / einsum on the dequantised operands.

Operand preparation that the peer's API needs but that the model would do once (cuBLASLt's
column-major activation scales, the bf16 dequantised weight) is cached per input buffer and kept
out of the timed call, like our own workspace.

The quant+gemm cases (bf16 activations in) are ours and torch's only (torch: the act_quant round
trip in torch ops, then the bf16 product): DeepGEMM and cuBLASLt take quantised operands, and
their plain gemm cases of the same shape time exactly that.

The bf16 cases (`op = "bf16"`, bf16 x and W, fp32 out) are ours and torch's: torch.mm on the bf16
operands with fp32 output (cuBLAS, fp32 accumulation: the reference's product without its fp32
upcasts), and torch.compile of it. DeepGEMM and cuBLASLt blockwise FP8 take FP8 operands.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, import_reason
from kernels.common import Prepared
from kernels.gemm.glue import dequant_operands, groups_of, quantises
from kernels.gemm.tiling import KBLOCK
from oracles.quant import dequant_fp8_weight, fp8_qdq_lowprec
from sweeps.gemm import BF16, QUANT_GEMM

QUANTISED_ONLY = ("takes quantised operands: its time on this shape is the plain gemm case's (the "
                  "quant+gemm op quantises bf16 activations inside the call)")
FP8_ONLY = "an FP8 GEMM: the bf16 op's operands are bf16 (torch.mm with fp32 output is its peer)"


def _is_bf16(case: Case) -> bool:
    return case.params.get("op") == BF16


class DeepGemm(Impl):
    """deepseek-ai/DeepGEMM (SM90: 1x128 activation / 128x128 weight fp32 scales): fp8_gemm_nt, and
    for the grouped wo_a fp8_einsum('bhr,hdr->bhd'), the call vLLM makes."""

    family, name, backend = "gemm", "deepgemm", "deepgemm"
    archs = ("any",)

    def available(self) -> str | None:
        return import_reason("deep_gemm")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if _is_bf16(case):
            return FP8_ONLY
        return QUANTISED_ONLY if quantises(case) else None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        deepgemm_product(inputs["x"], inputs["sa"], inputs["w"], inputs["sw"], out["out"], groups_of(case))
        return out


def deepgemm_product(x, sa, w, sw, y, groups: int = 1) -> None:
    """y = x . W^T by DeepGEMM: fp8_gemm_nt, or for G > 1 weight groups (wo_a) fp8_einsum."""
    import deep_gemm

    if groups == 1:
        deep_gemm.fp8_gemm_nt((x, sa), (w, sw), y)
        return
    m, k = x.shape[0], w.shape[1]
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (x.view(m, groups, k), sa.view(m, groups, -1)),
                         (w.view(groups, -1, k), sw.view(groups, -1, sw.shape[1])), y.view(m, groups, -1))


class CublasLt(Impl):
    """cuBLASLt blockwise FP8 via torch._scaled_mm (1x128 / 128x128 scales); no grouped form."""

    family, name, backend = "gemm", "cublaslt", "torch"
    archs = ("any",)

    def __init__(self):
        self._sa = Prepared()

    def available(self) -> str | None:
        return None if hasattr(torch, "_scaled_mm") else "torch._scaled_mm missing"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if _is_bf16(case):
            return FP8_ONLY
        if quantises(case):
            return QUANTISED_ONLY
        if groups_of(case) > 1:
            return "torch._scaled_mm has no grouped (block-diagonal) form: one launch per group"
        if case["n"] % 16 or case["k"] % 128:
            return "cuBLASLt blockwise FP8 needs N % 16 == 0 and K % 128 == 0"
        if case["m"] % 4:  # measured (cuBLAS of torch 2.11): M = 1 and 2495 refused, 8, 64, 256, 4096 taken
            return ("cuBLASLt blockwise FP8 needs M % 4 == 0 (16-byte aligned columns of its column-major "
                    "activation scales; CUBLAS_STATUS_NOT_SUPPORTED otherwise)")
        return None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        sa = self._sa.get((inputs["sa"],), lambda: inputs["sa"].t().contiguous().t())
        y = torch._scaled_mm(inputs["x"], inputs["w"].t(), scale_a=sa, scale_b=inputs["sw"].t(),
                             out_dtype=torch.bfloat16)
        return {"out": y}


def bf16_product(xb: torch.Tensor, wb: torch.Tensor, groups: int) -> torch.Tensor:
    """What a bf16 deployment runs: x @ W^T, or for wo_a the reference's bf16 einsum."""
    if groups == 1:
        return xb @ wb.t()
    m = xb.shape[0]
    return torch.einsum("mgk,gnk->mgn", xb.view(m, groups, -1), wb.view(groups, -1, wb.shape[1])).reshape(m, -1)


def quant_bf16_product(xb: torch.Tensor, wb: torch.Tensor, groups: int) -> torch.Tensor:
    """quant+gemm in torch: the reference's act_quant round trip of x (§2.3, in bf16), then `bf16_product`."""
    return bf16_product(fp8_qdq_lowprec(xb, KBLOCK), wb, groups)


def bf16_operands(x, w, sw, sa=None) -> tuple[torch.Tensor, torch.Tensor]:
    """x and W in bf16: dequantised, or x as it is when it comes in bf16 (quant+gemm)."""
    if sa is None:
        return x, dequant_fp8_weight(w, sw).bfloat16()
    return tuple(t.bfloat16() for t in dequant_operands(x, sa, w, sw))


def bf16_fp32_product(x: torch.Tensor, w: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """The bf16 op's peer: x . W^T on the bf16 operands with fp32 accumulation and output (torch.mm
    out_dtype on CUDA; the fp32 product elsewhere, where torch has no bf16 -> fp32 mm). Grouped (wo_a):
    the reference's own call, its bf16 einsum (bf16 out), widened to fp32."""
    if groups > 1:
        return bf16_product(x, w, groups).float()
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().t()


_BF16 = Prepared()


def _bf16_call(fns: dict, case: Case, inputs: dict) -> dict:
    """The bf16 operands are made once per input buffer (a bf16 model keeps its weights in bf16),
    out of the timed call."""
    if _is_bf16(case):
        return {"out": fns[BF16](inputs["x"], inputs["w"], groups_of(case))}
    xb, wb = _BF16.get(tuple(inputs.values()), lambda: bf16_operands(**inputs))
    return {"out": fns[QUANT_GEMM if quantises(case) else "gemm"](xb, wb, groups_of(case))}


def register_torch_peers() -> None:
    """torch (eager bf16 matmul / einsum on the dequantised operands; for quant+gemm, after torch's
    act_quant round trip) and torch_compile of it."""
    from dsv4bench.core.torch_impls import register_torch_baselines

    register_torch_baselines("gemm", {"gemm": bf16_product, QUANT_GEMM: quant_bf16_product,
                                         BF16: bf16_fp32_product}, _bf16_call)
