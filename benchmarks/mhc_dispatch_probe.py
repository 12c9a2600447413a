"""hc_pre / hc_head: pass 2 as a programmatic dependent launch (shipped) next to the same two
passes launched plainly, on the same inputs in one process, with the harness timer (CUDA events,
L2 flushed per call). Both variants are checked against the FP32 oracle by the harness rule.

    python3 benchmarks/mhc_dispatch_probe.py --out mhc-dispatch-probe.json

The H100 records (benchmarks/results/mhc-pdl-h100/) also hold the runs of the uncommitted steps
before it: the passes as two separately compiled functions (two host dispatches), which timed the
same as one host call, and the early trigger in every grid, which slowed prefill by 3.5%.
"""

from __future__ import annotations

import cutlass
import torch
from cutlass import cute
from cutlass.cute.runtime import make_fake_compact_tensor

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.worker import case_generator
from kernels.common import compile_kernel, fake_rowmajor
from kernels.mhc.apply import HcApplyKernel
from kernels.mhc.family import HC_MULT, HcTwoPass, MhcCuteDSL, MhcFamily
from probe_common import ARCH, run_probe, timed

FAMILY = MhcFamily()
CASES = [("pre", 64, 7168), ("pre", 64, 4096), ("head", 64, 7168), ("pre", 4096, 7168)]


def without_pdl(impl: MhcCuteDSL, case: Case):
    mix, apply = impl._passes(case)
    plain = HcApplyKernel(apply.head, apply.d, apply.splits, pdl=False)
    t, d = cute.sym_int(), case["d"]
    part = make_fake_compact_tensor(cutlass.Float32, (t, mix.splits, mix.n_mix + 1), stride_order=(2, 1, 0),
                                    assumed_align=4)
    fake = (fake_rowmajor("bf16", (t, HC_MULT * d)), fake_rowmajor("fp32", (mix.n_mix, HC_MULT * d)), part,
            fake_rowmajor("bf16", (t, HC_MULT, d)), fake_rowmajor("fp32", (1 if apply.head else 3,), 4),
            fake_rowmajor("fp32", (mix.n_mix,), 4), fake_rowmajor("bf16", (t, d)),
            fake_rowmajor("fp32", (t, HC_MULT), 4), fake_rowmajor("fp32", (t, HC_MULT * HC_MULT), 4))
    return compile_kernel(HcTwoPass(mix, plain), *fake, arch=ARCH)


def rows(timer):
    impl = MhcCuteDSL()
    for op, t, d in CASES:
        case = Case("mhc", {"op": op, "t": t, "d": d, "dtype": "bf16"})
        x = FAMILY.make_inputs(case, case_generator(case), "cuda")
        oracle, lowprec = FAMILY.oracle(case, x), FAMILY.lowprec(case, x)
        shipped = impl.compile(case, ARCH)
        for variant, compiled in (("pdl", shipped), ("no_pdl", without_pdl(impl, case)), ("pdl_again", shipped)):
            out = FAMILY.alloc_outputs(case, "cuda")
            run = lambda c=compiled, case=case, x=x, out=out: impl.run(case, x, out, c)  # noqa: E731
            row = {"case": f"{op} T={t} D={d}", "variant": variant, **timed(timer, run)}
            ok, metrics = compare_outputs(run(), oracle, lowprec, lambda n, case=case: FAMILY.tolerance_for(case, n))
            row.update(passes_oracle=bool(ok), error="; ".join(m.summary() for m in metrics.values()))
            yield row
        torch.cuda.empty_cache()


if __name__ == "__main__":
    run_probe(rows, with_copy=False)
