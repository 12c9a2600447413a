"""Where the time of the indexer's Hadamard-128 + MXFP4 quantisation goes: the shipped rotate path (v3)
next to the previous one (v2) and knock-outs, timed on the same inputs in one process with the harness timer
(CUDA events, L2 flushed per call), plus an empty kernel of the same grid (the launch floor) and a
256 MiB device copy (bandwidth). Knock-out outputs are garbage and not checked; the shipped kernel is
compared bit for bit with the oracle (oracles.quant.mxfp4_quant of oracles.hadamard's rotation).
v1 (16 lanes per row) and v1 with the branch-free e2m1 were measured by this probe at 66b5a7b
(benchmarks/results/quant-probe-h100-66b5a7b.json) before v1 was removed; v2's knock-outs are there too.

    python3 benchmarks/quant_probe.py --out quant-probe.json      (H100: about a minute)

rows 262144 (indexer q prefill, 85 MB) and 4096 (decode q)
    v3               the shipped kernel: 2 lanes per row, one full-exchange shuffle stage, e2m1 on bf16 pairs
    v2               the previous kernel: 4 lanes per row, half-exchange shuffles, fp32 e2m1_code
    v3_no_e2m1       knock-out: the bf16 pair itself instead of its two e2m1 codes
    v3_no_hadamard   knock-out: no rotation (bf16 in, quantised as is)
    empty_v3/v2      a kernel of the same grid that does nothing
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.worker import case_generator
from kernels.common import compile_kernel
from kernels.quant import family as qfam
from kernels.quant import rotate
from kernels.quant.quant import CTA_THREADS, ROT_ROWS_PER_CTA, QuantKernel
from probe_common import ARCH, empty_launch, run_probe, timed  # benchmarks/ is on sys.path as a script
from sweeps import quant as qspace


class NoE2m1:
    def e2m1x2(self, p, inv):
        return p


class NoHadamard:
    @cute.jit
    def hadamard(self, x: cute.Tensor, lane: cutlass.Int32):
        pass


class V2:
    @cute.jit
    def launch_rotate(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        self.launch_rotate_v2(mX, mQ, mS, stream)


VARIANTS = {  # label: (class, checked against the oracle)
    "v3": (QuantKernel, True),
    "v2": (type("V2", (V2, QuantKernel), {}), True),
    "v3_no_e2m1": (type("V3NoE2m1", (NoE2m1, QuantKernel), {}), False),
    "v3_no_hadamard": (type("V3NoH", (NoHadamard, QuantKernel), {}), False),
}
GRIDS = {"empty_v3": (rotate.ROWS_PER_CTA, rotate.THREADS), "empty_v2": (ROT_ROWS_PER_CTA, CTA_THREADS)}


def quant_rows(timer):
    fam, impl = qfam.QuantFamily(), qfam.QuantCuteDSL()
    for m in (262144, 4096):
        case = Case("quant", qspace.mxfp4(m), 0, "probe")
        x = fam.make_inputs(case, case_generator(case), "cuda")
        oracle, lowprec = fam.oracle(case, x), fam.lowprec(case, x)
        out = fam.alloc_outputs(case, "cuda")
        mb = fam.cost(case).bytes / 1e6
        for label, (cls, check) in VARIANTS.items():
            compiled = compile_kernel(cls("mxfp4", 128, 32, True), *impl_fake(impl, case), arch=ARCH)
            fn = lambda c=compiled: c(x["x"], out["codes"], out["scales"])  # noqa: E731
            out["codes"].fill_(0xA5)
            fn()
            torch.cuda.synchronize()
            ok = None
            if check:
                ok, _ = compare_outputs({k: v.clone() for k, v in out.items()}, oracle, lowprec,
                                        lambda n: fam.tolerance_for(case, n))
                ok = bool(ok)
            row = {"case": f"mxfp4+H {m} rows", "variant": label, "passes_oracle": ok, **timed(timer, fn)}
            row["gb_s"] = mb / row["median_us"] * 1e3
            yield row
        for label, (rows_per_cta, threads) in GRIDS.items():
            grid = -(-m // rows_per_cta)
            yield {"case": f"mxfp4+H {m} rows", "variant": label, **timed(timer, empty_launch(grid, threads))}
        del x, out
        torch.cuda.empty_cache()


def impl_fake(impl, case):
    """The fake (x, codes, scales) of QuantCuteDSL.compile."""
    import cutlass as c
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    n, block = case["n"], case["block"]
    rows = cute.sym_int()
    x = make_fake_tensor(c.BFloat16, (rows, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    q = make_fake_compact_tensor(c.Uint8, (rows, qfam.code_width(case)), stride_order=(1, 0), assumed_align=16)
    s = make_fake_compact_tensor(c.Uint8, (rows, n // block), stride_order=(1, 0), assumed_align=1)
    return x, q, s


if __name__ == "__main__":
    run_probe(quant_rows)
