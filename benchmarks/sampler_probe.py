"""Where the sampler's time goes at small B: the shipped kernel next to variants with one part
knocked out and an empty kernel of the same grid, on the same inputs in one process, with the
harness timer (CUDA events, L2 flushed per call) and CUPTI (`device_us`: the kernel alone, flush
excluded). Knock-out outputs are garbage and not checked; `full` is checked (exact tokens).

    python3 benchmarks/sampler_probe.py --out sampler-probe.json

full       SamplerKernel as shipped
no_merge   each CTA stores its partial and ends (no acq_rel atomic, no last-CTA merge)
no_rank    x - g replaced by logit + noise (no divide, no log) and no comparisons
loads_only no_rank and no_merge: loads, the block reduction, one store
empty      a kernel of the same grid and block that does nothing
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from dsv4bench.core.case import Case
from dsv4bench.core.worker import case_generator
from kernels.sampler.family import SamplerCuteDSL, SamplerFamily, compile_sampler
from kernels.sampler.sampler import DEPTH, THREADS, VEC, SamplerKernel, counters, plan
from probe_common import ARCH, empty_launch, run_probe, timed


class NoMerge(SamplerKernel):
    @cute.jit
    def merge(self, mPF, mPI, mCnt, mTok, row, split, splits, lane, x, g, i):
        if lane == 0:
            mPF[row, 0, split], mPF[row, 1, split], mPI[row, split] = x, g, i


class NoRank(SamplerKernel):
    @cute.jit
    def rank(self, logit, noise, tile, end, tidx, t_eff, best, sampled: cutlass.Constexpr):
        bx, bg, bi = best
        for k in cutlass.range_constexpr(DEPTH):
            for e in cutlass.range_constexpr(VEC):
                bx = bx + logit[k, e]
                if cutlass.const_expr(sampled):
                    bg = bg + noise[k, e]
        return bx, bg, bi + Int32(tile)


class LoadsOnly(NoRank, NoMerge):
    pass


VARIANTS = {"full": SamplerKernel, "no_merge": NoMerge, "no_rank": NoRank, "loads_only": LoadsOnly}
CASES = [(1, 0.6), (1, 0.0), (64, 0.6)]


def measure(timer, fn) -> dict:
    from dsv4bench.core.kernel_profile import kernel_times

    row = timed(timer, fn)
    kernels = kernel_times(fn, timer.flush)
    return {**row, "device_us": round(sum(kernels.values()), 3)}


def rows(timer):
    family, impl = SamplerFamily(), SamplerCuteDSL()
    for b, temperature in CASES:
        case = Case("sampler", {"b": b, "v": 129280, "temperature": temperature})
        x = family.make_inputs(case, case_generator(case), "cuda")
        out = family.alloc_outputs(case, "cuda")
        for name, cls in VARIANTS.items():
            compiled = compile_sampler(cls(case["v"]), ARCH)
            row = {"case": f"B={b} T={temperature}", "variant": name,
                   **measure(timer, lambda c=compiled: impl.run(case, x, out, c))}
            if name == "full":
                ref = family.oracle(case, x)["tokens"]
                row["exact_tokens"] = bool(torch.equal(impl.run(case, x, out, compiled)["tokens"].cpu(), ref.cpu()))
            yield row
        _, splits = plan(b, SamplerKernel(case["v"]).tiles)
        yield {"case": f"B={b}", "variant": "empty", **measure(timer, empty_launch((splits, b, 1), THREADS))}
        counters(b, "cuda").zero_()


if __name__ == "__main__":
    run_probe(rows, with_copy=False)
