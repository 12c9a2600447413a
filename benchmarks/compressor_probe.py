"""Where the time of the compressor kernels goes: each kernel next to variants with one part
knocked out (or swapped for a candidate), timed on the same inputs in one process with the harness
timer (CUDA events, L2 flushed per call), plus an empty kernel of the same grid (the launch floor)
and the copy bandwidth of the run. Knock-out outputs are garbage and not checked; every variant
that claims to be a correct kernel is compared with the FP32 oracle by the harness rule.

    python3 benchmarks/compressor_probe.py --out compressor-probe.json

compressor   full         the shipped kernel
             no_post      pooling only; RMSNorm/RoPE/FP8 knocked out (y stored as is)
             loads_only   the loads and the stores; the online softmax replaced by adds
             hca_pPgG     HCA with P CTAs per entry and G thread groups per CTA (p1g4 = v1)
             empty        a kernel of the same grid that does nothing
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
from kernels.compressor import family as cfam
from kernels.compressor.compressor import VEC, CsaKernel
from kernels.compressor.hca import HcaKernel

ARCH = "sm_90a"


class EmptyKernel:
    """Launches `grid` CTAs of `threads` threads that do nothing (a tensor argument carries the stream)."""

    def __init__(self, grid: tuple, threads: int):
        self.grid, self.threads = grid, threads

    @cute.jit
    def __call__(self, mT: cute.Tensor, stream):
        self.kernel().launch(grid=list(self.grid), block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self):
        pass


class NoPost:
    @cute.jit
    def finish(self, smem, y, mW, mTab, mOut, b, s, group, lane):
        if group == 0:
            out = cute.make_rmem_tensor((VEC,), mOut.element_type)
            out.store(y.load().to(mOut.element_type))
            cute.autovec_copy(out, cute.zipped_divide(mOut, (1, 1, VEC))[(0, 0, None), (b, s, lane)])


class LoadsOnly:
    @cute.jit
    def absorb(self, kv, z, mx, l, acc):
        for i in cutlass.range_constexpr(VEC):
            l[i] = l[i] + z[i]
            acc[i] = acc[i] + kv[i]
            mx[i] = z[i]


def timed(timer, fn) -> dict:
    stats = timer.time(fn)
    return {"median_us": stats.median_ms * 1e3, "cv": stats.cv}


def checked(fam, case, x, result) -> bool:
    ok, _ = compare_outputs(result, fam.oracle(case, x), fam.lowprec(case, x), lambda n: fam.tolerance_for(case, n))
    return bool(ok)


def copy_row(timer) -> dict:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row = timed(timer, lambda: dst.copy_(src))
    row.update(case="copy 256 MiB", variant="copy", tb_s=2 * src.numel() / row["median_us"] / 1e6)
    return row


def empty_launch(grid, threads, count):
    compiled = compile_kernel(EmptyKernel(grid, threads), fake_rowmajor("fp32", (cute.sym_int(),)), arch=ARCH)
    t = torch.empty(4, device="cuda")
    return lambda: [compiled(t) for _ in range(count)]


def compressor_rows(timer):
    fam, impl = cfam.CompressorFamily(), cfam.CompressorCuteDSL()
    shapes = {"csa_prefill": (4, 1, 16384), "csa_decode_128": (4, 128, 8),
              "hca_prefill": (128, 1, 16384), "hca_decode_128": (128, 128, 128)}
    for name, (m, b, s) in shapes.items():
        case = Case("compressor", {"m": m, "b": b, "s": s, "d": 512, "dtype": "bf16"}, 0, "probe")
        x = fam.make_inputs(case, case_generator(case), "cuda")
        out = fam.alloc_outputs(case, "cuda")
        args = (x["kv"], x["score"], x["norm_w"], x["table"], out["out"])
        variants = {}
        if m == 4:
            for label, cls in {"full": CsaKernel, "no_post": type("P", (NoPost, CsaKernel), {}),
                               "loads_only": type("L", (LoadsOnly, CsaKernel), {})}.items():
                if label in ("no_post", "loads_only") and b > 1:
                    continue
                variants[label] = (cls(m, 512, 1e-6), 1, True)
            grid = (cfam.entries(case), b, 1)
        else:
            for p, g in ((1, 4), (4, 1), (4, 2), (8, 1), (16, 1)):
                if b > 1 and (p, g) not in ((1, 4), (8, 1)):
                    continue
                variants[f"hca_p{p}g{g}"] = (HcaKernel(m, 512, 1e-6, splits=p, groups=g), p, True)
            if b == 1:
                variants["no_post"] = (type("P", (NoPost, HcaKernel), {})(m, 512, 1e-6), 8, False)
                variants["loads_only"] = (type("L", (LoadsOnly, HcaKernel), {})(m, 512, 1e-6), 8, False)
            grid = (8, cfam.entries(case), b)
        for label, (kernel, p, check) in variants.items():
            if m == 4:
                compiled = compile_kernel(kernel, *cfam.fake_args(case), arch=ARCH)
                fn = lambda c=compiled: c(*args)  # noqa: E731
            else:
                compiled = compile_kernel(kernel, *cfam.fake_args(case, p), arch=ARCH)
                scratch = cfam.hca_scratch(case, "cuda", p)
                fn = lambda c=compiled, sc=scratch: c(*args, *sc)  # noqa: E731
            fn()
            ok = checked(fam, case, x, cfam.split(out["out"])) if check else None
            yield {"case": name, "variant": label, "passes_oracle": ok, **timed(timer, fn)}
        yield {"case": name, "variant": "empty", **timed(timer, empty_launch(grid, 128, 1))}
        del x, out
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from dsv4bench.core.timing import CudaTimer

    timer = CudaTimer("cuda")
    rows = [copy_row(timer)]
    print(json.dumps(rows[0]), flush=True)
    for row in compressor_rows(timer):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every row: a run cut off by a time limit keeps what it measured
            json.dump({"device": torch.cuda.get_device_name(), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
