"""The gemm family: the DSV4 FP8 block-scaled linear y = x . W^T (spec §2.3 / §2.6) and its grouped
form, the output projection wo_a (§7.4): its inputs, oracle pairing, cost model, sweep options and
implementations (ours, DeepGEMM, cuBLASLt, torch).

Inputs are the quantised operands the GEMM consumes: x e4m3 [M, G*K] with fp32 power-of-two scales
per (row, 128 columns), W e4m3 [N, K] with one fp32 power-of-two scale per 128 x 128 block; G = 1
except for wo_a. Oracle: dequant(x) . blockdiag(dequant(W))^T in fp32 (oracles/linear.py). Low-
precision reference: the same product rounded to bf16 (the reference fp8_gemm accumulates in fp32 per
K block and writes bf16).

The cases with `op = "quant+gemm"` time the call a model makes instead: x comes in bf16 and is
quantised inside the call (the quant kernel writing the GEMM's operands, kernels/gemm/quant_gemm.py);
their oracle is the same product of the reference's act_quant(x) (§2.3, §2.6: x_qdq . W^T). Only ours
and torch (the act_quant round trip in torch ops, then the bf16 product) take them: the library
peers take quantised operands, which their plain gemm cases of the same shape time.

The cases with `op = "bf16"` are the bf16 GEMM (kernels/gemm/bf16_sm90.py), the model's GEMMs on
BF16 checkpoint weights (lm_head, the compressors' wkv / wgate, the indexer's weights_proj): x bf16
[M, K], W bf16 [N, K], y fp32. Oracle: x.float() @ W.float().T, the reference's own math (both
operands are bf16 values, so the kernel differs from it by summation order only). Low-precision
yardstick: that product rounded to bf16 (what a bf16-output matmul adds); the GPU tests hold the
kernel to the much tighter summation-order bound (tests/gemm/test_bf16_gemm_gpu.py). Peers: torch
(torch.mm on bf16 with fp32 output; its torch.compile); DeepGEMM and cuBLASLt FP8 take FP8 operands.

wo_a has both grouped forms. FP8 with the same recipe (`groups` on the FP8 cases): the checkpoint
stores it in FP8, FP8 halves the weight bytes that decode streams, and vLLM serves it that way
(DeepGEMM fp8_einsum). bf16 (`groups` on the bf16 cases): the reference's own math, a bf16 einsum on
the weight convert.py dequantises; the model's output_projection runs this one, since FP8 wo_a
quantises one activation the reference does not and left the kernel model's residual outside the
low-precision model's (issue #24).
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from kernels.gemm import peers
from kernels.gemm import bf16_serves
from kernels.gemm import serves as served
from kernels.gemm.bf16_config import Bf16Config, choose_bf16_config
from kernels.gemm.bf16_glue import (
    K_ALIGN, bf16_oracle, check_bf16_operands, compile_bf16_gemm, draw_bf16_operands, grouped_refusal,
    run_bf16_gemm,
)
from kernels.gemm.config import choose_config, choose_quant_gemm_config
from kernels.gemm.tiling import KBLOCK, GemmConfig
from kernels.gemm.glue import (
    check_operands, compile_gemm, draw_operands, groups_of, make_operands, oracle_of, quantises, run_gemm,
)
from kernels.gemm.quant_gemm import compile_quant_gemm, quant_operands, run_quant_gemm
from oracles.quant import fp8_block_quant
from sweeps import gemm as space

SM90_ONLY = ("the SM90 kernel is built on warpgroup MMA (wgmma) and Hopper TMA descriptors; sm_100a "
             "has no wgmma (it needs a tcgen05/TMEM kernel), so it is not compiled for sm_100a")


class GemmFamily(Family):
    name = "gemm"
    description = ("FP8 e4m3 block-scaled GEMM y = x W^T (1x128 act / 128x128 weight scales), bf16 out; "
                   "grouped for wo_a; op bf16: bf16 x bf16, fp32 out (the BF16 weights)")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = {**served.OPS, **bf16_serves.OPS}  # the model ops it serves (serves.py: FP8; bf16_serves.py: bf16)
    options = {
        "rows": Option("m", "token rows M of x (a value off the grid: every layer at that M)", "tokens", extends=True),
        "width": Option("n", "output features N (weight rows, all groups)", "features"),
        "depth": Option("k", "reduction length K of one group (a multiple of 128)", "elements"),
        "groups": Option("groups", "weight groups (1: a plain linear; 8 / 16: wo_a of Flash / Pro)", "groups"),
        "op": Option("op", "the call timed: gemm (pre-quantised operands), quant+gemm (bf16 activations "
                     "quantised inside the call) or bf16 (the bf16 x bf16 GEMM, fp32 out)",
                     choices=(space.QUANT_GEMM, space.BF16), names=True, aliases={"gemm": None}),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        shape = (case["m"], case["n"], case["k"], seed)
        if is_bf16(case):
            x, w = draw_bf16_operands(*shape, device=device, groups=groups_of(case))
            return {"x": x, "w": w}
        if quantises(case):
            x, w, sw = draw_operands(*shape, groups_of(case))
            return {"x": x.bfloat16().to(device), "w": w.to(device), "sw": sw.to(device)}
        x, sa, w, sw = make_operands(*shape, device, groups_of(case))
        return {"x": x, "sa": sa, "w": w, "sw": sw}

    def oracle(self, case: Case, inputs: dict) -> dict:
        if is_bf16(case):
            return {"out": bf16_oracle(inputs["x"], inputs["w"], groups_of(case))}
        x, sa = (inputs["x"], inputs["sa"]) if "sa" in inputs else fp8_block_quant(inputs["x"], KBLOCK)
        return {"out": oracle_of(x, sa, inputs["w"], inputs["sw"], groups_of(case))}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        return {"out": self.oracle(case, inputs)["out"].bfloat16()}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        if is_bf16(case):
            return {"out": torch.empty(case["m"], case["n"], dtype=torch.float32, device=device)}
        return {"out": torch.empty(case["m"], case["n"], dtype=torch.bfloat16, device=device)}

    def cost(self, case: Case) -> Cost:
        """Bytes: x (e4m3 and its scales, or bf16 for quant+gemm), W and its scales, y (bf16 op: x, W
        bf16, y fp32)."""
        m, n, k, g = case["m"], case["n"], case["k"], groups_of(case)
        if is_bf16(case):
            return Cost(flops=2.0 * m * n * k, bytes=float(2 * m * g * k + 2 * n * k + 4 * m * n))
        kb = k // KBLOCK
        nb = -(-n // KBLOCK)
        x_bytes = 2 * m * g * k if quantises(case) else m * g * k + 4 * m * g * kb
        return Cost(flops=2.0 * m * n * k, bytes=float(x_bytes + n * k + 4 * nb * kb + 2 * m * n))


class GemmCuteDSL(Impl):
    family, name, backend = "gemm", "cutedsl", "cutedsl"
    archs = ("sm_90a",)
    compiles = True
    min_rows = 16  # the rule's least decode x tile (variant `cutedsl:x64`: the v7 rule's 64)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if arch not in (None, "sm_90a"):
            return SM90_ONLY
        if is_bf16(case):
            if case["k"] % K_ALIGN:
                return f"K must be a multiple of {K_ALIGN} (16-byte TMA rows)"
            why = grouped_refusal(case["n"], case["k"], groups_of(case))
            return None if why is None else f"grouped: {why}"
        if case["k"] % KBLOCK:
            return f"K must be a multiple of {KBLOCK} (the quantisation block)"
        if case["n"] % 8:
            return "N must be a multiple of 8 (16-byte output rows for the TMA store)"
        if groups_of(case) > 1 and case["n"] % (groups_of(case) * KBLOCK):
            return f"grouped: each group's N must be a multiple of {KBLOCK} (whole weight-scale blocks)"
        return None

    def config(self, case: Case) -> GemmConfig:
        """The tile configuration of the case (the seam of the declared variants)."""
        if is_bf16(case):
            if type(self).config is not GemmCuteDSL.config:  # a declared variant (ConfigKnobs: UNSUPPORTED)
                raise ValueError("the declared variants override the FP8 kernel's tile rule; the bf16 op has its own")
            return choose_bf16_config(case["m"], case["n"], case["k"], groups=groups_of(case))
        choose = choose_quant_gemm_config if quantises(case) else choose_config
        return choose(case["m"], case["n"], case["k"], groups=groups_of(case), min_rows=self.min_rows)

    def compile_key(self, case: Case, arch: str) -> tuple:
        key = (self.family, "cutedsl", arch, self.config(case))
        if is_bf16(case):
            return key + (space.BF16, "fp32")
        return key + (space.QUANT_GEMM, groups_of(case) * case["k"]) if quantises(case) else key

    def compile(self, case: Case, arch: str):
        if arch != "sm_90a":
            raise ValueError(SM90_ONLY)
        if is_bf16(case):
            return compile_bf16_gemm(self.config(case), torch.float32, arch)
        if quantises(case):
            return compile_quant_gemm(self.config(case), groups_of(case) * case["k"], arch)
        return compile_gemm(self.config(case), arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        g, cfg = groups_of(case), self.config(case)
        if isinstance(cfg, Bf16Config):
            check_bf16_operands(inputs["x"], inputs["w"], out["out"], g)
            run_bf16_gemm(compiled, cfg, inputs["x"], inputs["w"], out["out"])
            return out
        x, w, sw, y = inputs["x"], inputs["w"], inputs["sw"], out["out"]
        if quantises(case):
            codes, sa = quant_operands(x, w, sw, y, g)
            run_quant_gemm(compiled, cfg, x, codes, sa, w, sw, y, g)
        else:
            check_operands(x, inputs["sa"], w, sw, y, g)
            run_gemm(compiled, cfg, x, inputs["sa"], w, sw, y, g)
        return out


def is_bf16(case) -> bool:
    """A case of the bf16 GEMM (`op = "bf16"`)."""
    return case.params.get("op") == space.BF16


FAMILY = register_family(GemmFamily())
for _impl in (GemmCuteDSL(), peers.DeepGemm(), peers.CublasLt()):
    register_impl(_impl)
peers.register_torch_peers()


def gemm(x: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
         out: torch.Tensor | None = None, groups: int = 1) -> torch.Tensor:
    """The op for model code: y = x . W^T (grouped: blockdiag(W)) with DSV4 FP8 operands (bad input ->
    ValueError naming the tensor). Compiled kernels are cached per tile configuration."""
    m, n, k = check_operands(x, sa, w, sw, out, groups)
    cfg = choose_config(m, n, k, groups=groups)
    if cfg not in _COMPILED:
        _COMPILED[cfg] = compile_gemm(cfg)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device) if out is None else out
    return run_gemm(_COMPILED[cfg], cfg, x, sa, w, sw, out, groups)


_COMPILED: dict = {}

# Declared variants (tile-rule ablations, run only when named: `--impl cutedsl:<name>`). They
# subclass GemmCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.gemm import variants  # noqa: E402,F401
from kernels.gemm import bf16_variants  # noqa: E402,F401 (the bf16 op's tile variants)
