"""Where a decode GEMM's CTAs spend their time: the rule's configuration with phase stamps (GemmConfig.stamps).

    python3 benchmarks/gemm_phases.py --layers flash.wkv,flash.wo_b --rows 1,64 --out phases.jsonl

Each CTA's first unit: prologue, the first stage's wait, mainloop, merge, epilogue (clock cycles at the CTA's clock,
measured from its globaltimer entry / exit stamps), its start in the kernel's span; the stamps of the last of `--reps`
flushed calls. The stamped output must equal the rule's; both are event-timed beside each other (the stamps' cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import torch

from dsv4bench.core.timing import CudaTimer
from kernels.common import sm_count
from kernels.gemm.config import choose_config
from kernels.gemm.glue import compile_gemm, make_operands, run_gemm, workspace
from kernels.gemm.gemm_sm90 import (STAMP_ENTRY, STAMP_ENTRY_NS, STAMP_EXIT, STAMP_EXIT_NS, STAMP_FIRST_STAGE,
                                    STAMP_LOADS, STAMP_MAINLOOP, STAMP_MERGED)
from kernels.gemm.tiling import STAMP_SLOTS
from sweeps.gemm import LAYERS

PHASES = {"prologue": (STAMP_ENTRY, STAMP_LOADS), "first_stage": (STAMP_LOADS, STAMP_FIRST_STAGE),
          "mainloop": (STAMP_FIRST_STAGE, STAMP_MAINLOOP), "merge": (STAMP_MAINLOOP, STAMP_MERGED),
          "epilogue": (STAMP_MERGED, STAMP_EXIT), "cta": (STAMP_ENTRY, STAMP_EXIT)}


def phases(stamps: torch.Tensor, ctas: int) -> dict:
    """Per phase, median and max over the CTAs, in ns (each CTA's cycles at its own measured clock); the CTAs' start
    spread and the kernel's span from the globaltimer stamps."""
    s = stamps[: ctas * STAMP_SLOTS].view(ctas, STAMP_SLOTS).to(torch.int64).cpu()
    cyc = lambda a, b: (s[:, b] - s[:, a]) % (1 << 32)  # noqa: E731 (32-bit counters wrap)
    ns_wall = (s[:, STAMP_EXIT_NS] - s[:, STAMP_ENTRY_NS]) % (1 << 32)
    ghz = cyc(STAMP_ENTRY, STAMP_EXIT).double() / ns_wall.clamp(min=1).double()
    out = {"ghz_median": round(statistics.median(ghz.tolist()), 3)}
    stores = s[:, STAMP_MERGED] != 0  # split-K slices that hand their partial on stamp no merge
    for name, (a, b) in PHASES.items():
        rows = stores if name in ("merge", "epilogue") else torch.ones_like(stores)
        vals = (cyc(a, b).double() / ghz)[rows].tolist()
        out[name] = [round(statistics.median(vals)), round(max(vals))] if vals else None
    entry = s[:, STAMP_ENTRY_NS]
    start = (entry - entry.min()) % (1 << 32)
    out["start_spread"] = [round(statistics.median(start.tolist())), int(start.max())]
    out["span"] = int(((s[:, STAMP_EXIT_NS] - entry.min()) % (1 << 32)).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="flash.wkv,flash.wq_a,flash.shared_w2,flash.wo_b,pro.wkv,pro.wo_b",
                    help="model.layer names of sweeps/gemm.py (ungrouped)")
    ap.add_argument("--rows", default="1", help="token rows M, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="JSONL file for the records")
    args = ap.parse_args()
    shapes = {f"{model}.{layer}": (n, k) for model, layer, n, k, g in LAYERS if g == 1}
    try:
        rows = [int(v) for v in args.rows.split(",")]
    except ValueError:
        raise SystemExit(f"--rows takes comma-separated token counts, got {args.rows!r}") from None
    if any(m < 1 for m in rows):
        raise SystemExit(f"--rows takes token counts of at least 1, got {args.rows!r}")
    layers = args.layers.split(",")
    unknown = [name for name in layers if name not in shapes]
    if unknown:
        raise SystemExit(f"unknown layer(s) {', '.join(unknown)}; ungrouped layers: {', '.join(shapes)}")
    if not torch.cuda.is_available():
        raise SystemExit("gemm_phases: the phase stamps need a CUDA GPU (SM90); none is visible")
    timer = CudaTimer("cuda")
    sink = open(args.out, "w", buffering=1) if args.out else None  # line-buffered: a hang keeps the records so far
    for name in layers:
        n, k = shapes[name]
        for m in rows:
            rule = choose_config(m, n, k)
            try:
                stamped = replace(rule, stamps=True)
            except ValueError as e:  # the rule's global split-K (M 65-128): its workspace is the partial sums
                print(f"{name} M {m}: skipped, {e}")
                continue
            plain_k, stamped_k = compile_gemm(rule), compile_gemm(stamped)
            x, sa, w, sw = make_operands(m, n, k, seed=m, device="cuda")
            y0, y1 = (torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            run_gemm(plain_k, rule, x, sa, w, sw, y0)
            for _ in range(args.reps):
                timer.flush()
                run_gemm(stamped_k, stamped, x, sa, w, sw, y1)
            torch.cuda.synchronize()
            if not torch.equal(y0, y1):
                raise SystemExit(f"{name} M {m}: the stamped kernel's output differs from the rule's")
            work, _ = workspace(stamped, m, n, x.device)
            slots = work.view(torch.int32)[: sm_count(x.device) * STAMP_SLOTS]
            ctas = int((slots.view(-1, STAMP_SLOTS)[:, STAMP_ENTRY_NS] != 0).sum())  # the CTAs that ran
            rec = {"layer": name, "m": m, "n": n, "k": k, "config": str(rule), "ctas": ctas, "ns": phases(slots, ctas)}
            for key, cfg, kern, y in (("us_rule", rule, plain_k, y0), ("us_stamped", stamped, stamped_k, y1)):
                rec[key] = round(timer.time(lambda: run_gemm(kern, cfg, x, sa, w, sw, y)).median_ms * 1e3, 2)
            work.zero_()
            print(json.dumps(rec), flush=True)
            if sink:
                sink.write(json.dumps(rec) + "\n")
    if sink:
        sink.close()


if __name__ == "__main__":
    main()
