"""Side-by-side timing of the fmha impls on the issue's shapes, one process, one device.

    python3 benchmarks/fmha_bench.py --out benchmarks/results/fmha-h100.json

Every timed output is validated against the FP32 oracle first (docs/benchmarking.md); L2 is flushed
between iterations. Ratios are peer_time / our_time (> 1 means we are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_impl
from dsv4bench.core.evaluate import case_generator, poison
from dsv4bench.core.results import UNCHECKED
from kernels.fmha.family import FAMILY
from sweeps.fmha import _sparse, dense_bench

IMPLS = ("cutedsl", "flashmla", "fa4", "cudnn", "torch")


def bench_cases() -> dict[str, dict]:
    return {
        "pro_prefill": _sparse(h_q=128, s_q=4096, topk=1152, s_kv=8192, lse=False),
        "flash_prefill": _sparse(h_q=64, s_q=4096, topk=640, s_kv=8192, lse=False),
        "pro_prefill_16k": _sparse(h_q=128, s_q=16384, topk=1152, s_kv=32768, lse=False),
        "flash_prefill_16k": _sparse(h_q=64, s_q=16384, topk=640, s_kv=32768, lse=False),
        "pro_decode_64": _sparse(h_q=128, s_q=64, topk=1152, window=0, kv_layout="per_token", lse=False),
        "pro_decode_128": _sparse(h_q=128, s_q=128, topk=1152, window=0, kv_layout="per_token", lse=False),
        "flash_decode_64": _sparse(h_q=64, s_q=64, topk=640, window=0, kv_layout="per_token", lse=False),
        **{f"dense_hd{c['hd']}" + ("_causal" if c["mask"] == "causal" else ""): c for c in dense_bench()},
    }


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers (argparse turns the error into one usage line)."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def topk_sweep_cases(widths: list[int], heads: list[int]) -> dict[str, dict]:
    """Prefills (s_q 4096) at several top-k widths and query-head counts: time per CTA = a + b x tiles
    fits each kernel's fixed and per-tile cost (docs/perf/fmha.md); h_q 16 and 8 are the TP-8 splits."""
    if not widths or any(k < 1 or k > 8192 for k in widths):
        raise SystemExit(f"fmha_bench: --topk-sweep takes widths in [1, 8192], got {widths}")
    if not heads or any(h < 1 or h > 128 for h in heads):
        raise SystemExit(f"fmha_bench: --heads takes query-head counts in [1, 128], got {heads}")
    return {f"h{h}_k{k}": _sparse(h_q=h, s_q=4096, topk=k, s_kv=8192, lse=False) for h in heads for k in widths}


def device_info() -> dict:
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem"
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # no nvidia-smi on the box
        info["nvidia_smi"] = f"unavailable ({type(e).__name__})"
    return info


def save(record: dict, path: str) -> None:
    """Write the record with each peer's time over ours."""
    ours = {r["case"]: r for r in record["results"] if r["impl"] == "cutedsl" and "median_ms" in r}
    for r in record["results"]:
        if r["impl"] != "cutedsl" and "median_ms" in r and r["case"] in ours:
            r["ratio_vs_ours"] = r["median_ms"] / ours[r["case"]]["median_ms"]
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--topk-sweep", type=int_list, default=None,
                    help="comma-separated top-k widths: time s_q 4096 prefills at --heads of these widths instead "
                         "of the named cases (the a + b x tiles fit)")
    ap.add_argument("--heads", type=int_list, default=[64, 128], help="query heads of the --topk-sweep cases")
    ap.add_argument("--rounds", type=int, default=1,
                    help="timing rounds per case, the impls interleaved in each, round r starting with impl r")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"fmha_bench: --rounds must be >= 1, got {args.rounds}")
    cases = topk_sweep_cases(args.topk_sweep, args.heads) if args.topk_sweep else bench_cases()
    from dsv4bench.core import ceilings
    from dsv4bench.core.timing import CudaTimer

    timer = CudaTimer("cuda")
    ceil = ceilings.measure("cuda")
    record = {"commit": os.environ.get("DSV4BENCH_COMMIT", "unknown"), "device": device_info(),
              "ceilings": ceil.to_json(), "l2_flush": True, "results": []}
    print(record["device"], record["ceilings"], flush=True)
    names = [n for n in cases if not args.only or n in args.only.split(",")]
    for name in names:
        case = Case("fmha", cases[name], 0, "bench")
        x = FAMILY.make_inputs(case, case_generator(case), "cuda")
        ref, low = FAMILY.oracle(case, x), FAMILY.lowprec(case, x)
        cost = FAMILY.cost(case)
        timed = []  # (row, call) of every impl that passed its check
        for impl_name in args.impls.split(","):
            impl = get_impl("fmha", impl_name)
            row = {"case": name, "case_id": case.id, "params": dict(case.params), "impl": impl_name}
            record["results"].append(row)
            reason = impl.available() or impl.supports(case, "sm_90a")
            if reason:
                row["status"] = "UNSUPPORTED: " + reason
                continue
            try:
                compiled = None
                if impl.compiles:
                    t0 = time.perf_counter()
                    compiled = impl.compile(case, "sm_90a")
                    row["compile_s"] = round(time.perf_counter() - t0, 2)
                out = FAMILY.alloc_outputs(case, "cuda")
                poison(out)
                holder = {}

                def call(impl=impl, x=x, out=out, compiled=compiled, holder=holder):
                    holder["r"] = impl.run(case, x, out, compiled)

                call()
                torch.cuda.synchronize()
                ok, m = compare_outputs(holder["r"], ref, low, lambda n: FAMILY.tolerance_for(case, n))
                row["check"] = {k: v.summary() for k, v in m.items()}
                row["status"] = "PASS" if ok else "FAIL_NUMERIC"
                if not impl.checked:
                    row["status"] = UNCHECKED  # a knock-out: timed beside the kernel, its output never judged
                timed.append((row, call, holder))
            except Exception as e:
                row["status"] = f"FAIL_RUNTIME: {type(e).__name__}: {str(e)[:300]}"
        # rounds interleave the impls, so a clock or neighbour drift during the case hits them alike, and
        # rotate which goes first (the first of a round ran up to ~5% slow on 3 ms kernels:
        # docs/lessons/gemm.md 11); each impl's figure is the median of its rounds' medians
        for r in range(args.rounds):
            turn = r % len(timed) if timed else 0
            for row, call, _holder in timed[turn:] + timed[:turn]:
                row.setdefault("round_ms", []).append(timer.time(call).median_ms)
        for row, call, holder in timed:
            ok, _ = compare_outputs(holder["r"], ref, low, lambda n: FAMILY.tolerance_for(case, n))
            if not ok and row["status"] == "PASS":
                row["status"] = "FAIL_NUMERIC"  # wrong after the timed calls (a race shows here)
            ms = statistics.median(row["round_ms"])
            row.update(median_ms=ms, tflops=cost.flops / ms / 1e9, gbps=cost.bytes / ms / 1e6,
                       pct_copy=100 * cost.bytes / ms / 1e6 / ceil.copy_gbps)
        for row in record["results"][-len(args.impls.split(",")):]:
            print(json.dumps({k: v for k, v in row.items() if k != "params"}), flush=True)
        del x, ref, low
        torch.cuda.empty_cache()
        save(record, args.out)  # after every case: a run cut off by a time limit keeps what it measured
    print("\n| case | impl | status | ms | TFLOP/s | GB/s | peer/ours |\n|---|---|---|---|---|---|---|")
    for r in record["results"]:
        if "median_ms" in r:
            print(f"| {r['case']} | {r['impl']} | {r['status']} | {r['median_ms']:.3f} | {r['tflops']:.0f} | "
                  f"{r['gbps']:.0f} | {r.get('ratio_vs_ours', 1.0):.2f} |")
        else:
            print(f"| {r['case']} | {r['impl']} | {r['status'][:60]} | | | | |")


if __name__ == "__main__":
    main()
