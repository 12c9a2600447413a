#!/usr/bin/env python3
"""Where the fused decode top-k beats the unfused pair (the data behind kernels/indexer/config.py
`fuse_select`): for each width W and batch B, every request W keys, k = 1024, the fused kernels
(`select(..., fused=True)`) and the pair (the paged decode kernel, then the top-k kernel), each with
`check_select` as the harness's impls run them, timed as the harness times (dsv4bench/core/timing.py:
L2 flushed before each iteration, CUDA events, median) in 4 rounds that alternate which goes first;
reported: the mean of each one's middle two rounds and unfused / fused. GPU only (an H100 here).

    PYTHONPATH=. python3 benchmarks/select_crossover.py --widths 262144,131072 --batches 1,8,32,128
"""

from __future__ import annotations

import argparse

import torch

from dsv4bench.core.timing import CudaTimer
from kernels.indexer.decode_glue import make_decode_inputs, run_decode
from kernels.indexer.select_glue import check_select, compile_select, select
from kernels.indexer.topk_glue import run_topk

ROUNDS = 4


def routes(compiled, x: dict, width: int, k: int, out: torch.Tensor) -> dict:
    def fused():
        check_select(**x, width=width, k=k, out=out)
        select(compiled, **x, width=width, out=out, fused=True)

    def unfused():
        check_select(**x, width=width, k=k, out=out)
        logits = torch.empty(out.shape[0], width, device=out.device)
        run_decode(compiled.decode, **x, out=logits)
        run_topk(compiled.topk, logits, out)

    return {"fused": fused, "unfused": unfused}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="262144,131072,65536")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--k", type=int, default=1024)
    args = ap.parse_args()
    compiled, timer = compile_select(), CudaTimer()
    for width in map(int, args.widths.split(",")):
        for n_req in map(int, args.batches.split(",")):
            x = make_decode_inputs([width] * n_req, width, seed=n_req, device="cuda")
            out = torch.empty(n_req, min(args.k, width), dtype=torch.int32, device="cuda")
            fns = routes(compiled, x, width, args.k, out)
            times: dict = {name: [] for name in fns}
            for r in range(ROUNDS):
                for name in (sorted(fns) if r % 2 == 0 else sorted(fns, reverse=True)):
                    times[name].append(timer.time(fns[name], min_iters=20, max_iters=40).median_ms * 1e3)
            mid = {name: sum(sorted(t)[1:3]) / 2 for name, t in times.items()}
            print(f"W={width} B={n_req}: fused {mid['fused']:.1f} us unfused {mid['unfused']:.1f} us "
                  f"unfused/fused {mid['unfused'] / mid['fused']:.3f}", flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
