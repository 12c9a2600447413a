"""Where the time of the indexer's Hadamard-128 + MXFP4 quantisation goes: the shipped rotate path (v4)
next to v3's loads and knock-outs, timed on the same inputs in one process with the harness timer
(CUDA events, L2 flushed per call), plus a kernel moving the op's bytes with a copy's access pattern,
an empty kernel of the same grid (the launch floor) and a 256 MiB device copy (bandwidth). Knock-out
outputs are garbage and not checked; the real kernels are compared bit for bit with the oracle
(oracles.quant.mxfp4_quant of oracles.hadamard's rotation). v1 and v2 were measured by this probe at
66b5a7b (benchmarks/results/quant-probe-h100-66b5a7b.json) before they were removed; the v4
candidates that lost (persistent warps, 3 stages, a row per lane) are in docs/perf/quant.md.

    python3 benchmarks/quant_probe.py --out quant-probe.json      (H100: about a minute)

rows 262144 (indexer q prefill, 85 MB) and 4096 (decode q)
    v4               the shipped kernel: 2 lanes per row, loads staged through shared memory
    v3_direct_loads  v4 with v3's loads: straight into registers, one 32-byte sector of each of 16 rows
                     per warp instruction
    v4_no_e2m1       knock-out: the bf16 pair itself instead of its two e2m1 codes
    v4_no_hadamard   knock-out: no rotation (bf16 in, quantised as is)
    v4_pattern_only  both knocked out: v4's loads and stores with next to no math
    v3_pattern_only  the same with v3's loads
    ideal_traffic    the op's bytes with a copy's access pattern (512 contiguous bytes per warp instruction)
    torch_read_x     torch's sum of the input: a read of the 67 MB alone
    empty            a kernel of the same grid that does nothing
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
from kernels.quant.quant import QuantKernel
from probe_common import ARCH, empty_launch, run_probe, timed  # benchmarks/ is on sys.path as a script
from sweeps import quant as qspace


class NoE2m1:
    def e2m1x2(self, p, inv):
        return p


class NoHadamard:
    @cute.jit
    def hadamard(self, x: cute.Tensor, lane: cutlass.Int32):
        pass


class DirectLoads:
    """v3's loads: lane l of a row loads its vectors l + 2j straight into registers (a row past the
    end reloads the last row)."""

    @cute.jit
    def load_row(self, mX: cute.Tensor, row: cutlass.Int32, lane: cutlass.Int32) -> cute.Tensor:
        gX = cute.zipped_divide(mX, (1, rotate.VEC))
        raw = cute.make_rmem_tensor((rotate.VEC, rotate.VECS), mX.element_type)
        src = cutlass.min(row, mX.shape[0] - 1)
        for j in cutlass.range_constexpr(rotate.VECS):
            cute.autovec_copy(gX[(0, None), (src, lane + rotate.LANES * j)], raw[None, j])
        return raw


class IdealTraffic:
    """The op's bytes with a copy's access pattern: CTA b reads rows 64b..64b+63 (16 KB, contiguous
    when the row stride is 128) with every warp instruction on 512 contiguous bytes, and writes their
    64 code bytes and 4 scale bytes per row the same way; the stored words depend on every load."""

    def __init__(self, *_):
        pass

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        self.kernel(mX, mQ, mS).launch(grid=[cute.ceil_div(mX.shape[0], 64), 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gX = cute.zipped_divide(mX, (1, 8))
        raw = cute.make_rmem_tensor((8, 8), mX.element_type)
        for j in cutlass.range_constexpr(8):
            e = 128 * j + tidx  # 16-byte vector e of the CTA's 64 rows
            src = cutlass.min(64 * bidx + e // 16, mX.shape[0] - 1)
            cute.autovec_copy(gX[(0, None), (src, e % 16)], raw[None, j])
        words = cute.recast_tensor(raw, cutlass.Int32)
        acc = words[0]
        for i in cutlass.range_constexpr(1, 32):
            acc = acc ^ words[i]
        out = cute.make_rmem_tensor((4,), cutlass.Int32)
        for i in cutlass.range_constexpr(4):
            out[i] = acc + i
        gQ = cute.zipped_divide(cute.recast_tensor(mQ, cutlass.Int32), (1, 4))
        for j in cutlass.range_constexpr(2):
            e = 128 * j + tidx  # 16-byte vector e of the CTA's 64 code rows
            if 64 * bidx + e // 4 < mX.shape[0]:
                cute.autovec_copy(out, gQ[(0, None), (64 * bidx + e // 4, e % 4)])
        for k in cutlass.range_constexpr(2):
            b = 2 * tidx + k  # scale byte b of the CTA's 64 rows
            if 64 * bidx + b // 4 < mX.shape[0]:
                mS[64 * bidx + b // 4, b % 4] = cutlass.Uint8(acc >> (8 * k))


VARIANTS = {  # label: (class, checked against the oracle)
    "v4": (QuantKernel, True),
    "v3_direct_loads": (type("V3", (DirectLoads, QuantKernel), {}), True),
    "v4_no_e2m1": (type("V4NoE2m1", (NoE2m1, QuantKernel), {}), False),
    "v4_no_hadamard": (type("V4NoH", (NoHadamard, QuantKernel), {}), False),
    "v4_pattern_only": (type("V4Pattern", (NoE2m1, NoHadamard, QuantKernel), {}), False),
    "v3_pattern_only": (type("V3Pattern", (NoE2m1, NoHadamard, DirectLoads, QuantKernel), {}), False),
    "ideal_traffic": (IdealTraffic, False),
}


def quant_rows(timer):
    fam, impl = qfam.QuantFamily(), qfam.QuantCuteDSL()
    for m in (262144, 4096):
        case = Case("quant", qspace.mxfp4(m), 0, "probe")
        print(f"mxfp4+H: x [{m}, 128] bf16 -> codes [{m}, 64] u8 + scales [{m}, 4] u8", flush=True)
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
        row = {"case": f"mxfp4+H {m} rows", "variant": "torch_read_x", **timed(timer, lambda: x["x"].sum(dtype=torch.float32))}
        row["gb_s"] = x["x"].numel() * 2 / row["median_us"] / 1e3
        yield row
        grid = -(-m // rotate.ROWS_PER_CTA)
        yield {"case": f"mxfp4+H {m} rows", "variant": "empty", **timed(timer, empty_launch(grid, rotate.THREADS))}
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
