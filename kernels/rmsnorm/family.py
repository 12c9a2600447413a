"""The RMSNorm family: case space, oracle pairing, cost model and its implementations."""

from __future__ import annotations

import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import CUTE_DTYPES, TORCH_DTYPES, compile_kernel, fake_rowmajor
from kernels.rmsnorm import serves as served
from kernels.rmsnorm.rmsnorm import RmsNormKernel
from oracles.norm import NORM_EPS, rmsnorm, rmsnorm_lowprec
from sweeps import rmsnorm as space


def compile_rmsnorm(dt: str, n: int, weight: bool, arch: str, **knobs):
    """Compile the kernel from fake tensors (rows a runtime size); knobs: RmsNormConfig tuning."""
    rows = cute.sym_int()
    x, o = fake_rowmajor(dt, (rows, n)), fake_rowmajor(dt, (rows, n))
    w = fake_rowmajor(dt, (n,)) if weight else None
    kernel = RmsNormKernel(CUTE_DTYPES[dt], n, weight, NORM_EPS, **knobs)
    return compile_kernel(kernel, x, w, o, arch=arch)


class RmsNormFamily(Family):
    name = "rmsnorm"
    description = "RMSNorm over the last dim (spec §2.1), weighted and weightless"
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/rmsnorm/serves.py)
    options = {
        "width": Option("n", "normalised width (the last dim)", "elements"),
        "rows": Option("m", "rows normalised", "rows"),
        "dtype": Option("dtype", "element type", choices=tuple(sorted(TORCH_DTYPES)), names=True),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        m, n, dt = case["m"], case["n"], TORCH_DTYPES[case["dtype"]]
        x = (torch.randn(m, n, generator=gen) * 2.0 + 0.5).to(dt)
        inputs = {"x": x.to(device)}
        if case["weight"]:
            inputs["w"] = (1.0 + 0.5 * torch.randn(n, generator=gen)).to(dt).to(device)
        return inputs

    def oracle(self, case: Case, inputs: dict) -> dict:
        # an fp32 kernel is judged against fp64 math: an fp32 oracle would share its rounding
        wide = torch.float64 if case["dtype"] == "fp32" else torch.float32
        return {"out": rmsnorm(inputs["x"], inputs.get("w"), NORM_EPS, compute_dtype=wide)}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        return {"out": rmsnorm_lowprec(inputs["x"], inputs.get("w"), NORM_EPS)}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        return {"out": torch.empty(case["m"], case["n"], dtype=TORCH_DTYPES[case["dtype"]], device=device)}

    def cost(self, case: Case) -> Cost:
        m, n = case["m"], case["n"]
        es = TORCH_DTYPES[case["dtype"]].itemsize
        return Cost(flops=4.0 * m * n, bytes=float(2 * m * n * es + (n * es if case["weight"] else 0)))


class RmsNormCuteDSL(Impl):
    family, name, backend = "rmsnorm", "cutedsl", "cutedsl"
    compiles = True
    knobs: dict = {}  # RmsNormConfig tuning knobs: {} is the shipped default (a declared variant sets its own)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            RmsNormKernel(CUTE_DTYPES[case["dtype"]], case["n"], case["weight"], **self.knobs)
        except ValueError as e:
            return str(e)
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, case["dtype"], case["n"], bool(case["weight"]), NORM_EPS)

    def compile(self, case: Case, arch: str):
        return compile_rmsnorm(case["dtype"], case["n"], bool(case["weight"]), arch, **self.knobs)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        compiled(inputs["x"], inputs.get("w"), out["out"])
        return out


class RmsNormQuack(Impl):
    family, name, backend = "rmsnorm", "quack", "quack"
    archs = ("any",)

    def available(self) -> str | None:
        try:
            import quack.rmsnorm  # noqa: F401
        except Exception as e:  # ImportError, or a CUDA-only import failing on a CPU box
            return f"quack not importable ({type(e).__name__})"
        return None

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        return None if case["dtype"] in ("bf16", "fp16", "fp32") and case["n"] % 8 == 0 else "quack needs n % 8 == 0"

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from quack.rmsnorm import rmsnorm_fwd

        return {"out": rmsnorm_fwd(inputs["x"], inputs.get("w"), eps=NORM_EPS)[0]}


register_family(RmsNormFamily())
for _impl in (RmsNormCuteDSL(), RmsNormQuack()):
    register_impl(_impl)
register_torch_baselines(
    "rmsnorm", rmsnorm_lowprec, lambda fn, case, inputs: {"out": fn(inputs["x"], inputs.get("w"), NORM_EPS)},
    eager=lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps),  # the fused eager op
)

# Declared variants (tuning knob sets, run only when named: `--impl cutedsl:<knobs>`).
# They subclass RmsNormCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.rmsnorm import variants  # noqa: E402,F401
