"""The MoE router family (spec §8.1), from the fp32 gate logits: sqrt(softplus) scores, top-k on
score + bias (or hash ids from tid2eid for layers 0-2), weights renormalised × route_scale.

Scope: the gate GEMM (x @ gate.T in fp32) is a GEMM and stays outside; the family's input is its
output, the logits [T, E]. The oracle is oracles.moe.route applied to those logits with an identity
gate (E × E), whose fp32 product reproduces the logits exactly, so the selection is the oracle's;
its fp32 weights are the low-precision reference and fp64 weights of the same ids the truth.
Expert ids compare as sets per token; weights (fp32) beside their ids by the pass rule of docs/benchmarking.md.
"""

from __future__ import annotations

from dataclasses import replace

import cutlass
import cutlass.cute as cute
import torch
import torch.nn.functional as F
from cutlass.cute.runtime import make_fake_compact_tensor

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import compile_kernel
from kernels.router import serves as served
from kernels.router.eager import route_from_logits
from kernels.router.router import RouterKernel
from oracles.moe import route
from sweeps import router as space

TRANSCENDENTAL_FLOPS = 20  # exp, log1p and sqrt per expert, counted as ~20 flops


def _fake(dtype, shape):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=4)


class RouterFamily(Family):
    name = "router"
    description = "MoE router from gate logits: sqrt-softplus, bias top-6 or tid2eid hash, renorm × route_scale (§8.1)"
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-5)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/router/serves.py)
    options = {
        "experts": Option("e", "routed experts (256 Flash, 384 Pro)", "experts"),
        "rows": Option("t", "tokens", "tokens"),
        "hash": Option("hashed", "hash-routed layers (tid2eid) instead of score top-k", flag=True),
    }

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        """Expert ids as a set per token, each weight beside its id: the oracle puts equal biased scores' ids lower
        first, as the kernel does; a peer on torch.topk may order them otherwise."""
        return Tolerance(index_set=True) if output == "indices" else replace(self.tolerance, paired_with="indices")

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        t, e, k = case["t"], case["e"], case["k"]
        inputs = {"logits": torch.randn(t, e, generator=gen) * 3.0 - 1.0}
        if case["hashed"]:
            inputs["tid2eid"] = torch.randint(0, e, (case["vocab"], k), generator=gen, dtype=torch.int32)
            inputs["input_ids"] = torch.randint(0, case["vocab"], (t,), generator=gen, dtype=torch.int32)
        else:
            inputs["bias"] = torch.randn(e, generator=gen) * 0.5
        if case.get("ties"):  # coarse grids: equal biased scores on many rows (sweeps/router.py)
            inputs["logits"] = (inputs["logits"] * 2).round() / 2
            if "bias" in inputs:  # a hashed case has none
                inputs["bias"] = (inputs["bias"] * 4).round() / 4
        return {name: v.to(device) for name, v in inputs.items()}

    def oracle(self, case: Case, inputs: dict) -> dict:
        """Expert ids from oracles.moe.route; their weights re-evaluated in fp64 ("true math").

        route() computes in fp32 only, which is also the reference router's precision: as the oracle
        it would leave an fp32 kernel a bound of zero plus one rounding (a 1-ulp difference in
        one softplus fails), so fp32 outputs are judged against fp64 math, as the rmsnorm family does.
        """
        ids = self.lowprec(case, inputs)["indices"]
        scores = F.softplus(inputs["logits"].cpu().double()).sqrt().gather(-1, ids)
        return {"weights": scores / scores.sum(-1, keepdim=True) * case["scale"], "indices": ids}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        """oracles.moe.route (fp32, the reference router's precision) on the CPU."""
        cpu = {k: v.cpu() for k, v in inputs.items()}
        identity = torch.eye(case["e"], dtype=torch.float32)
        w, idx = route(cpu["logits"], identity, case["k"], case["scale"], cpu.get("bias"),
                       cpu.get("tid2eid"), cpu.get("input_ids"))
        return {"weights": w, "indices": idx}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        t, k = case["t"], case["k"]
        return {"weights": torch.empty(t, k, dtype=torch.float32, device=device),
                "indices": torch.empty(t, k, dtype=torch.int32, device=device)}

    def cost(self, case: Case) -> Cost:
        t, e, k = case["t"], case["e"], case["k"]
        out = t * k * 8
        if case["hashed"]:  # ids, k table entries and k logits per token
            return Cost(flops=float(t * k * (TRANSCENDENTAL_FLOPS + 3)), bytes=float(t * 4 + t * k * 8 + out))
        return Cost(flops=float(t * e * (TRANSCENDENTAL_FLOPS + 1 + k)), bytes=float(t * e * 4 + e * 4 + out))


class RouterCuteDSL(Impl):
    family, name, backend = "router", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            RouterKernel(case["e"], case["k"], case["scale"], case["hashed"])
        except ValueError as err:
            return str(err)
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, case["e"], case["k"], case["scale"], bool(case["hashed"]))

    def compile(self, case: Case, arch: str):
        e, k, hashed = case["e"], case["k"], bool(case["hashed"])
        t = cute.sym_int()
        logits = _fake(cutlass.Float32, (t, e))
        bias = None if hashed else _fake(cutlass.Float32, (e,))
        tid2eid = _fake(cutlass.Int32, (cute.sym_int(), k)) if hashed else None
        ids = _fake(cutlass.Int32, (t,)) if hashed else None
        w, idx = _fake(cutlass.Float32, (t, k)), _fake(cutlass.Int32, (t, k))
        return compile_kernel(self.make_kernel(case), logits, bias, tid2eid, ids, w, idx, arch=arch)

    def make_kernel(self, case: Case):
        """The kernel object to compile (a declared variant, kernels/router/variants.py, returns its own)."""
        return RouterKernel(case["e"], case["k"], case["scale"], bool(case["hashed"]))

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        compiled(inputs["logits"], inputs.get("bias"), inputs.get("tid2eid"), inputs.get("input_ids"),
                 out["weights"], out["indices"])
        return out


register_family(RouterFamily())
register_impl(RouterCuteDSL())
register_torch_baselines("router", route_from_logits, lambda fn, case, inputs: fn(
    inputs["logits"], inputs.get("bias"), inputs.get("tid2eid"), inputs.get("input_ids"), case["k"], case["scale"]))

# Declared variants (knock-outs and ablations, run only when named: `--impl cutedsl:<variant>`).
# They subclass RouterCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.router import variants  # noqa: E402,F401
