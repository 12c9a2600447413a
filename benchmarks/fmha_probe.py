"""Where the time of the SM90 fmha kernel goes: the real kernel next to variants with one part
knocked out, timed on the same inputs in one process (the knock-outs' outputs are garbage and
are not checked; the shipped kernel and any candidate in CHECKED are checked against the oracle).

    python3 benchmarks/fmha_probe.py --out fmha-probe.json [--only pro_prefill,flash_prefill] [--variants full,no_mufu]

- full        the kernel as shipped
- no_gather   the producer publishes the indices and arrives, but copies no kv rows
- no_softmax  the MMAs and every barrier run; masking and the exponentials do not
- no_math     consumers only wait for each tile and free it (no MMA, no softmax; key split and ping-pong)
- no_mufu     the softmax's exp2 replaced by one FMA (what the MUFU's share of the softmax is)

If no_gather is about as fast as full, the math side is the bound; if no_math is, the gather is.
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
from kernels.common import compile_kernel
from kernels.fmha.family import FAMILY
from kernels.fmha.fmha_sm90 import GatherAttentionSm90
from kernels.fmha.glue import FmhaCuteDSL, config_for, fake_args

from fmha_bench import bench_cases  # benchmarks/ is on sys.path when run as a script


class NoGather(GatherAttentionSm90):
    @cute.jit
    def _copy_kv(self, atom, sIdx, mT, dst, seg0: int, n_segs: int, ptid, stage, kvh, bidx):
        pass

    @cute.jit
    def _copy_half_rows(self, atom, mK, dst, rows, t, h: int, kvh, bidx):
        pass


class NoSoftmax(GatherAttentionSm90):
    @cute.jit
    def _mask_tile(self, S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window):
        pass

    @cute.jit
    def _softmax_tile(self, S_mn, P_mn, corr, cS_mn, row_max, row_sum, sM, wtid, r: int, m_new, scale_log2):
        corr[r] = cutlass.Float32(1.0)

    @cute.jit
    def _softmax_scores(self, S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window,
                        corr, stage):
        corr.fill(1.0)


class NoMath(GatherAttentionSm90):
    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        for pair in cutlass.range(n_pairs, unroll=1):
            for hb in cutlass.range_constexpr(2):
                cute.arch.mbarrier_wait(bars + hb, pair & 1)
            cute.arch.mbarrier_arrive(bars + 4 + 0)
            cute.arch.mbarrier_wait(bars + 2, pair & 1)
            cute.arch.mbarrier_arrive(bars + 4 + 2)

    @cute.jit
    def _pairs_wg1(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        for pair in cutlass.range(n_pairs, unroll=1):
            for hb in cutlass.range_constexpr(2):
                cute.arch.mbarrier_wait(bars + 3 - hb, pair & 1)
            cute.arch.mbarrier_arrive(bars + 4 + 3)
            cute.arch.mbarrier_wait(bars + 1, pair & 1)
            cute.arch.mbarrier_arrive(bars + 4 + 1)


    @cute.jit
    def _pingpong(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                  row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, wg, base, q_empty):
        for kt in cutlass.range(base, base + n_tiles, unroll=1):
            self._wait_k(bars, kt)
            self._release_k(bars, kt)
            self._wait_v(bars, kt)
            self._release_v(bars, kt)
        cute.arch.mbarrier_arrive(q_empty)


class NoMufu(GatherAttentionSm90):
    @cute.jit
    def _exp2(self, x, cc: cutlass.Constexpr):
        return x * cutlass.Float32(0.5) + cutlass.Float32(1.0)


VARIANTS = {"full": GatherAttentionSm90, "no_gather": NoGather, "no_softmax": NoSoftmax, "no_math": NoMath,
            "no_mufu": NoMufu}
CHECKED = ("full",)  # the variants that claim correct outputs (candidates go here while they are tried)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="pro_prefill,flash_prefill,pro_decode_64")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    from dsv4bench.core.timing import CudaTimer

    timer = CudaTimer("cuda")
    impl = FmhaCuteDSL()
    rows = []
    for name in args.only.split(","):
        case = Case("fmha", bench_cases()[name], 0, "bench")
        cfg = config_for(case)
        x = FAMILY.make_inputs(case, case_generator(case), "cuda")
        out = FAMILY.alloc_outputs(case, "cuda")
        oracle, lowprec = FAMILY.oracle(case, x), FAMILY.lowprec(case, x)
        for variant in args.variants.split(","):
            cls = VARIANTS[variant]
            if variant == "no_math" and not (cfg.key_split or cfg.n_dsplit == 1):
                continue  # written for the key-split and ping-pong schedules
            compiled = compile_kernel(cls(cfg), *fake_args(cfg), arch="sm_90a")
            stats = timer.time(lambda c=compiled, case=case, x=x, out=out: impl.run(case, x, out, c))
            rows.append({"case": name, "variant": variant, "median_ms": stats.median_ms, "cv": stats.cv})
            if variant in CHECKED:
                ok, metrics = compare_outputs(impl.run(case, x, out, compiled), oracle, lowprec,
                                              lambda n: FAMILY.tolerance_for(case, n))
                rows[-1]["passes_oracle"] = bool(ok)
                rows[-1]["error"] = "; ".join(m.summary() for m in metrics.values())
            print(json.dumps(rows[-1]), flush=True)
            with open(args.out, "w") as f:  # after every row: a run cut off by its limit keeps what it measured
                json.dump({"results": rows}, f, indent=1)
        del x, out, oracle, lowprec
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
