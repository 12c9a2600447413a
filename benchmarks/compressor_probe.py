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

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.worker import case_generator
from kernels.common import compile_kernel
from kernels.compressor import family as cfam
from kernels.compressor.compressor import VEC, CsaKernel
from kernels.compressor.hca import HcaKernel
from probe_common import ARCH, empty_launch, run_probe, timed  # benchmarks/ is on sys.path as a script


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


def checked(fam, case, x, result) -> bool:
    ok, _ = compare_outputs(result, fam.oracle(case, x), fam.lowprec(case, x), lambda n: fam.tolerance_for(case, n))
    return bool(ok)


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
        yield {"case": name, "variant": "empty", **timed(timer, empty_launch(grid, 128))}
        del x, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    run_probe(compressor_rows)
