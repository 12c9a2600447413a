"""The sampler family (spec §9.3): temperature + Gumbel-max over the vocabulary, argmax for T = 0.

Noise contract: the family draws a seed per case, then n = torch.empty(B, V).exponential_(1) from
torch.Generator().manual_seed(seed) on the CPU — exactly the draw oracles.head.sample makes from a
generator with that seed — and hands n to every impl. Sampled tokens are compared exactly.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import compile_kernel
from kernels.sampler import serves as served
from kernels.sampler.eager import sample_with_noise
from kernels.sampler.sampler import SamplerKernel, counters
from oracles.head import sample
from sweeps import sampler as space

FLOPS_PER_TOKEN = 12  # divide, log (~8), subtract, compare


def _fake(dtype, shape, align=4):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=align)


def noise_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


class SamplerFamily(Family):
    name = "sampler"
    description = "temperature + Gumbel-max sampling over the vocabulary (seeded noise input), argmax at T = 0 (§9.3)"
    tolerance = Tolerance(exact=True)
    space = space
    serves = served.OPS  # the model op it serves (kernels/sampler/serves.py)
    options = {
        "vocab": Option("v", "vocabulary size", "tokens"),
        "rows": Option("b", "sequences sampled at once (batch)", "rows"),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        """Logits rounded to bf16 (so a row's maximum is often tied: T = 0 must pick the lowest index)."""
        b, v = case["b"], case["v"]
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        logits = (torch.randn(b, v, generator=gen) * 2.0).to(torch.bfloat16).float()
        noise = torch.empty(b, v).exponential_(1, generator=noise_generator(seed))
        temps = torch.full((b,), float(case["temperature"]))
        inputs = {"logits": logits, "temperatures": temps, "noise": noise, "seed": torch.tensor(seed)}
        return {k: t.to(device) for k, t in inputs.items()}

    def oracle(self, case: Case, inputs: dict) -> dict:
        logits = inputs["logits"].cpu()
        return {"tokens": sample(logits, case["temperature"], noise_generator(int(inputs["seed"])))}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        """The torch peer on the CPU (fed the family's noise tensor instead of the generator)."""
        return {"tokens": sample_with_noise(inputs["logits"].cpu(), inputs["temperatures"].cpu(), inputs["noise"].cpu())}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        """Tokens, and the kernel's per-split workspace (written before it is read; the arrival
        counters, which must start at zero, are not outputs: see `run`)."""
        b, width = case["b"], SamplerKernel(case["v"]).tiles
        return {
            "tokens": torch.empty(b, dtype=torch.int64, device=device),
            "partial_keys": torch.empty(b, 2, width, dtype=torch.float32, device=device),
            "partial_index": torch.empty(b, width, dtype=torch.int32, device=device),
        }

    def cost(self, case: Case) -> Cost:
        """Minimum bytes: the logits, the noise (not read at T = 0), temperatures and tokens."""
        b, v = case["b"], case["v"]
        reads = b * v * (4 if case["temperature"] == 0 else 8)
        return Cost(flops=float(b * v * FLOPS_PER_TOKEN), bytes=float(reads + b * 12))


def compile_sampler(kernel: SamplerKernel, arch: str):
    """`kernel` (a SamplerKernel, or a declared variant's subclass of it) for any B, with fake tensors."""
    b = cute.sym_int()
    logits, noise = _fake(cutlass.Float32, (b, kernel.vocab), 16), _fake(cutlass.Float32, (b, kernel.vocab), 16)
    temps = _fake(cutlass.Float32, (b,))
    part_f, part_i = _fake(cutlass.Float32, (b, 2, kernel.tiles)), _fake(cutlass.Int32, (b, kernel.tiles))
    count = _fake(cutlass.Int32, (cute.sym_int(),))
    return compile_kernel(kernel, logits, temps, noise, part_f, part_i, count, _fake(cutlass.Int64, (b,), 8),
                          arch=arch)


class SamplerCuteDSL(Impl):
    family, name, backend = "sampler", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            SamplerKernel(case["v"])
        except ValueError as err:
            return str(err)
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, case["v"])

    def make_kernel(self, case: Case):
        """The kernel object to compile (a declared variant, kernels/sampler/variants.py, returns its own)."""
        return SamplerKernel(case["v"])

    def compile(self, case: Case, arch: str):
        return compile_sampler(self.make_kernel(case), arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        compiled(inputs["logits"], inputs["temperatures"], inputs["noise"], out["partial_keys"],
                 out["partial_index"], counters(case["b"], out["tokens"].device), out["tokens"])
        return out


register_family(SamplerFamily())
register_impl(SamplerCuteDSL())
register_torch_baselines("sampler", sample_with_noise, lambda fn, case, inputs: {
    "tokens": fn(inputs["logits"], inputs["temperatures"], inputs["noise"])})

# Declared variants (knock-outs, run only when named: `--impl cutedsl:<variant>`).
# They subclass SamplerCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.sampler import variants  # noqa: E402,F401
