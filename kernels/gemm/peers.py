"""Peers of the gemm family, each behind its own import: DeepGEMM fp8_gemm_nt, cuBLASLt blockwise
FP8 through torch._scaled_mm, and bf16 torch.matmul on the dequantised operands.

Operand preparation that the peer's API needs but that the model would do once (cuBLASLt's
column-major activation scales, the bf16 dequantised weight) is cached per input buffer and kept
out of the timed call, like our own workspace.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl


def _import_reason(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as e:  # ImportError, or a CUDA-only import failing on a CPU box
        return f"{module} not importable ({type(e).__name__}: {str(e)[:80]})"
    return None


class _Prepared:
    """One cached derived tensor per (impl, source buffer)."""

    def __init__(self):
        self._key = None
        self._val = None

    def get(self, key, make):
        if key != self._key:
            self._key, self._val = key, None
            self._val = make()
        return self._val


def _key(*ts):
    return tuple((t.data_ptr(), tuple(t.shape), t._version) for t in ts)


class DeepGemm(Impl):
    """deepseek-ai/DeepGEMM fp8_gemm_nt (SM90: 1x128 activation / 128x128 weight fp32 scales)."""

    family, name, backend = "gemm", "deepgemm", "deepgemm"
    archs = ("any",)

    def available(self) -> str | None:
        return _import_reason("deep_gemm")

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        import deep_gemm

        deep_gemm.fp8_gemm_nt((inputs["x"], inputs["sa"]), (inputs["w"], inputs["sw"]), out["out"])
        return out


class CublasLt(Impl):
    """cuBLASLt blockwise FP8 via torch._scaled_mm (1x128 / 128x128 scales)."""

    family, name, backend = "gemm", "cublaslt", "torch"
    archs = ("any",)

    def __init__(self):
        self._sa = _Prepared()

    def available(self) -> str | None:
        return None if hasattr(torch, "_scaled_mm") else "torch._scaled_mm missing"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["n"] % 16 or case["k"] % 128:
            return "cuBLASLt blockwise FP8 needs N % 16 == 0 and K % 128 == 0"
        return None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        sa = self._sa.get(_key(inputs["sa"]), lambda: inputs["sa"].t().contiguous().t())
        y = torch._scaled_mm(inputs["x"], inputs["w"].t(), scale_a=sa, scale_b=inputs["sw"].t(),
                             out_dtype=torch.bfloat16)
        return {"out": y}


class TorchBf16(Impl):
    """bf16 torch.matmul on the dequantised operands (what a non-FP8 deployment would run)."""

    family, name, backend = "gemm", "torch_bf16", "torch"
    archs = ("any",)

    def __init__(self):
        self._ops = _Prepared()

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from kernels.gemm.glue import dequant_operands

        xb, wb = self._ops.get(_key(inputs["x"], inputs["w"], inputs["sa"], inputs["sw"]),
                               lambda: tuple(t.bfloat16() for t in dequant_operands(**inputs)))
        torch.matmul(xb, wb.t(), out=out["out"])
        return out
