"""The activation-quantisation family: bf16 → FP8 e4m3 / MXFP4 e2m1 codes + ue8m0 scales (spec §2.3-§2.5).

Outputs are compared bit for bit with the oracle (oracles/quant.py, oracles/hadamard.py):
`codes` uint8 (e4m3 bits, or packed e2m1 nibbles with element 2k low) and `scales` uint8 (ue8m0).
The rotated MXFP4 path quantises bf16(H_128·x·128^-0.5) computed in fp32, the reference's
`rotate_activation`; the kernel's butterfly and the oracle's matmul agree bit for bit whenever the
fp32 sums are exact, which holds unless a 128-row spans more than ~2^9 in magnitude (docs/perf/quant.md).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import compile_kernel
from kernels.quant import eager
from kernels.quant.quant import QuantConfig, QuantKernel
from oracles.hadamard import hadamard_rotate_lowprec
from oracles.quant import fp8_block_quant, mxfp4_quant, pack_fp4, ue8m0_encode
from sweeps import quant as space


def code_width(case: Case) -> int:
    return case["n"] if case["fmt"] == "fp8" else case["n"] // 2


class QuantFamily(Family):
    name = "quant"
    description = "activation quant: FP8 e4m3 per 128/64, Hadamard-128 + MXFP4 per 32; ue8m0 scales (§2.3-§2.5)"
    tolerance = Tolerance(exact=True)
    space = space
    options = {
        "format": Option("fmt", "output format: FP8 e4m3 codes, or MXFP4 (e2m1 pairs)", choices=("fp8", "mxfp4"),
                         names=True),
        "rotate": Option("rotate", "Hadamard-128 rotation before MXFP4 (the indexer's path)", flag=True),
        "width": Option("n", "quantised columns per row", "elements"),
        "rows": Option("m", "rows (tokens, or tokens x heads)", "rows"),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        """Rows of random magnitude (2^-10 .. 2^10), sparse outliers, and at the edges of the scale
        rules: a row below the FP8 amax floor and, from 3 rows on, one all-zero row (FP4 floor)."""
        m, n, stride = case["m"], case["n"], case["stride"]
        row_scale = torch.exp2(torch.empty(m, 1).uniform_(-10, 10, generator=gen))
        x = torch.randn(m, stride, generator=gen) * row_scale
        outliers = torch.rand(m, stride, generator=gen) < 0.002
        x = torch.where(outliers, x * 40.0, x)
        x[0] *= 1e-7 / float(row_scale[0])  # amax < 1e-4: the FP8 floor decides the scale
        if m >= 3:
            x[m // 2] = 0.0
        full = x.to(torch.bfloat16).to(device)
        return {"x": full[:, :n]}

    def oracle(self, case: Case, inputs: dict) -> dict:
        x = inputs["x"].cpu()
        if case["fmt"] == "fp8":
            codes, scale = fp8_block_quant(x, case["block"], "ue8m0")
            return {"codes": codes.view(torch.uint8), "scales": ue8m0_encode(scale)}
        if case["rotate"]:
            x = hadamard_rotate_lowprec(x)
        codes, scale = mxfp4_quant(x, case["block"])
        return {"codes": pack_fp4(codes), "scales": ue8m0_encode(scale)}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        """The torch peer's composition, on the CPU."""
        return eager.quant(inputs["x"].cpu(), case["fmt"], case["block"], case["rotate"])

    def alloc_outputs(self, case: Case, device: str) -> dict:
        m = case["m"]
        return {
            "codes": torch.empty(m, code_width(case), dtype=torch.uint8, device=device),
            "scales": torch.empty(m, case["n"] // case["block"], dtype=torch.uint8, device=device),
        }

    def cost(self, case: Case) -> Cost:
        """Bytes: read x (bf16), write codes and one scale byte per block. Flops: abs-max, scale and
        round per element (~4), plus log2(128) = 7 add/sub and one multiply per element when rotating."""
        m, n = case["m"], case["n"]
        flops = m * n * (4 + (8 if case["rotate"] else 0))
        return Cost(flops=float(flops), bytes=float(m * n * 2 + m * code_width(case) + m * n // case["block"]))


def fake_args(case: Case) -> tuple:
    """Fake (x, codes, scales) of a launch: rows a run-time size, x's row stride a run-time multiple of 8."""
    n, block = case["n"], case["block"]
    rows = cute.sym_int()
    x = make_fake_tensor(cutlass.BFloat16, (rows, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    q = make_fake_compact_tensor(cutlass.Uint8, (rows, code_width(case)), stride_order=(1, 0), assumed_align=16)
    s = make_fake_compact_tensor(cutlass.Uint8, (rows, n // block), stride_order=(1, 0), assumed_align=1)
    return x, q, s


class QuantCuteDSL(Impl):
    family, name, backend = "quant", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            QuantConfig.make(case["fmt"], case["n"], case["block"], case["rotate"])
        except ValueError as e:
            return str(e)
        return None if case["stride"] % 8 == 0 else "row stride must keep 16-byte alignment"

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, case["fmt"], case["n"], case["block"], bool(case["rotate"]))

    def make_kernel(self, case: Case):
        """The kernel object to compile (a declared variant, kernels/quant/variants.py, returns its own)."""
        return QuantKernel(case["fmt"], case["n"], case["block"], bool(case["rotate"]))

    def compile(self, case: Case, arch: str):
        return compile_kernel(self.make_kernel(case), *fake_args(case), arch=arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        compiled(inputs["x"], out["codes"], out["scales"])
        return out


register_family(QuantFamily())
register_impl(QuantCuteDSL())
register_torch_baselines(
    "quant", eager.quant, lambda fn, case, inputs: fn(inputs["x"], case["fmt"], case["block"], case["rotate"])
)

# Declared variants (knock-outs and reference rows, run only when named: `--impl cutedsl:<variant>`).
# They subclass QuantCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.quant import variants  # noqa: E402,F401
