"""Where the time of the indexer's Hadamard-128 + MXFP4 quantisation goes: the shipped rotate path (4
lanes per row) next to knock-outs, timed on the same inputs in one process with the harness timer
(CUDA events, L2 flushed per call), plus an empty kernel of the same grid (the launch floor) and a
256 MiB device copy (bandwidth). Knock-out outputs are garbage and not checked; the shipped kernel is
compared bit for bit with the oracle (oracles.quant.mxfp4_quant of oracles.hadamard's rotation).
v1 (16 lanes per row) and v1 with the branch-free e2m1 were measured by this probe at 66b5a7b
(benchmarks/results/quant-probe-h100-66b5a7b.json) before v1 was removed.

    python3 benchmarks/quant_probe.py --out quant-probe.json      (H100: about a minute)

rows 262144 (indexer q prefill, 85 MB) and 4096 (decode q)
    v2               the shipped kernel: 4 lanes per row, half-exchange shuffles, e2m1_code_rne
    v2_no_e2m1       knock-out: the scaled value's raw low bits instead of the e2m1 code
    v2_no_hadamard   knock-out: no rotation (bf16 in, quantised as is)
    empty            a kernel of the same grid that does nothing
"""

from __future__ import annotations

import argparse
import json

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.worker import case_generator
from kernels.common import compile_kernel, fake_rowmajor
from kernels.quant import family as qfam
from kernels.quant.numerics import f32_bits
from kernels.quant.quant import CTA_THREADS, ROT_ROWS_PER_CTA, QuantKernel
from sweeps import quant as qspace

ARCH = "sm_90a"


class EmptyKernel:
    """Launches `grid` CTAs of `threads` threads that do nothing (a tensor argument carries the stream)."""

    def __init__(self, grid: int, threads: int):
        self.grid, self.threads = grid, threads

    @cute.jit
    def __call__(self, mT: cute.Tensor, stream):
        self.kernel().launch(grid=[self.grid, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self):
        pass


class NoE2m1:
    def e2m1(self, v):
        return f32_bits(v) & 0xF


class NoHadamardV2:
    @cute.jit
    def hadamard_v2(self, x: cute.Tensor, lane: cutlass.Int32):
        pass


VARIANTS = {  # label: (class, checked against the oracle)
    "v2": (QuantKernel, True),
    "v2_no_e2m1": (type("V2NoE2m1", (NoE2m1, QuantKernel), {}), False),
    "v2_no_hadamard": (type("V2NoH", (NoHadamardV2, QuantKernel), {}), False),
}


def timed(timer, fn) -> dict:
    stats = timer.time(fn)
    return {"median_us": stats.median_ms * 1e3, "cv": stats.cv}


def copy_row(timer) -> dict:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row = timed(timer, lambda: dst.copy_(src))
    row.update(case="copy 256 MiB", variant="copy", tb_s=2 * src.numel() / row["median_us"] / 1e6)
    return row


def empty_launch(grid, threads):
    compiled = compile_kernel(EmptyKernel(grid, threads), fake_rowmajor("fp32", (cute.sym_int(),)), arch=ARCH)
    t = torch.empty(4, device="cuda")
    return lambda: compiled(t)


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
        grid = -(-m // ROT_ROWS_PER_CTA)
        yield {"case": f"mxfp4+H {m} rows", "variant": "empty", **timed(timer, empty_launch(grid, CTA_THREADS))}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from dsv4bench.core.timing import CudaTimer

    timer = CudaTimer("cuda")
    rows = [copy_row(timer)]
    print(json.dumps(rows[0]), flush=True)
    for row in quant_rows(timer):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every row: a run cut off by a time limit keeps what it measured
            json.dump({"device": torch.cuda.get_device_name(), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
