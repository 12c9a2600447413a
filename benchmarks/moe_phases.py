"""Where a moe decode layer call's GEMMs spend their time: v5's phase stamps (GroupedConfig.stamps, the variant
`cutedsl:stamps`) of one graph-replayed layer call, per kernel and phase, over its CTAs.

    python3 benchmarks/moe_phases.py --model flash --experts 256 --tokens 1,8 --out phases.jsonl

A stamp is a CTA's globaltimer at: entry, its work list ready, its first stage issued (the TMA warp), that stage in
(the first consumer thread), its first item's K loop done, its last epilogue done (exit). Times are µs from the
earliest L1 CTA's entry; per kernel and stamp the median and max over the CTAs. The stamped call is checked against
the FP32 oracle and timed beside the rule's (graph replays, one process): the stamps' cost."""

from __future__ import annotations

import contextlib
import json
import statistics

import torch
from moe_stages import graph_us, layer_args, layer_parser, prepare

from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.deadline import case_deadline
from dsv4bench.core.graphs import capture
from dsv4bench.core.registry import load_families
from dsv4bench.core.timing import CudaTimer
from kernels.moe.family import FAMILY
from kernels.moe.grouped_config import STAMP_CTAS, STAMP_SLOTS, STAMPS
from kernels.moe.layer import stamp_workspace
from sweeps.moe import case as moe_case

KERNELS = ("l1", "l2")  # the workspace's stamp regions, in order (GroupedConfig.stamps)


def timelines(words: torch.Tensor) -> dict:
    """Per kernel and stamp, (median, max) µs over the CTAs that stamped, from the earliest L1 entry (32-bit ns
    stamps: differences taken modulo 2^32)."""
    regions = words[: len(KERNELS) * STAMP_CTAS * STAMP_SLOTS].view(len(KERNELS), STAMP_CTAS, STAMP_SLOTS)
    regions = regions.to(torch.int64).cpu() % (1 << 32)
    l1 = regions[0][regions[0][:, 0] != 0]
    if not len(l1):
        raise RuntimeError("no L1 stamps: the call did not run the stamped build on this workspace")
    t0 = int(l1[:, 0].min())
    out = {}
    for name, region in zip(KERNELS, regions):
        ctas = region[region[:, 0] != 0]
        if not len(ctas):
            continue
        out[name] = {"ctas": len(ctas)}
        for j, stamp in enumerate(STAMPS):  # over the CTAs that wrote it (one with no item stamps no item's phases)
            us = [((int(v) - t0) % (1 << 32)) / 1e3 for v in ctas[:, j] if v]
            out[name][stamp] = (round(statistics.median(us), 2), round(max(us), 2)) if us else None
    return out


def phases(params: dict, timer: CudaTimer, reps: int) -> dict:
    ready = prepare("cutedsl:stamps", params)
    if isinstance(ready, str):
        return {"params": params, "skipped": ready}
    impl, case, inputs, out = ready
    compiled = impl.compile(case, "sm_90a")
    work = stamp_workspace(torch.device("cuda", torch.cuda.current_device()))[0]  # the layer's key: "cuda:0"
    impl.run(case, inputs, out, compiled)
    torch.cuda.synchronize()
    passed, _ = compare_outputs(out, FAMILY.oracle(case, inputs), FAMILY.lowprec(case, inputs),
                                lambda name: FAMILY.tolerance_for(case, name))
    call = lambda: impl.run(case, inputs, out, compiled)  # noqa: E731
    graph = capture(call)
    runs = []
    for _ in range(reps):  # each replay's stamps from a zeroed workspace and a flushed L2, as the sweep times them
        work.zero_()
        timer.flush()
        graph.replay()
        torch.cuda.synchronize()
        runs.append(timelines(work.view(torch.int32)))
    rule, rule_case, rule_inputs, rule_out = prepare("cutedsl", params)
    rule_compiled = rule.compile(rule_case, "sm_90a")
    rule_us = graph_us(timer, lambda: rule.run(rule_case, rule_inputs, rule_out, rule_compiled))
    return {"params": params, "passed": passed, "stamped_us": round(graph_us(timer, call), 2),
            "rule_us": round(rule_us, 2), "runs": runs}


def main() -> None:
    ap = layer_parser(__doc__, "1", "case")
    ap.add_argument("--reps", type=int, default=5, help="stamped replays a case (each printed)")
    a, tokens = layer_args(ap, max_tokens=64)  # the masked layout's v5 tiles
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it replays the kernels)")
    load_families()
    timer = CudaTimer("cuda")
    with open(a.out, "a") if a.out else contextlib.nullcontext() as sink:
        for t in tokens:
            with case_deadline(a.timeout, f"{a.model} T={t}"):
                r = phases(moe_case("layer", a.model, t, "uniform", e=a.experts), timer, a.reps)
            head = f"{a.model} e={r['params']['e']} T={t}"
            if "skipped" in r:
                print(f"{head}: skipped: {r['skipped']}", flush=True)
                continue
            print(f"{head}: stamped {r['stamped_us']} us, rule {r['rule_us']} us, "
                  f"{'PASS' if r['passed'] else 'FAIL'}", flush=True)
            for run in r["runs"]:
                print("  " + " | ".join(f"{k} ({v['ctas']} CTAs) " + " ".join(
                    f"{s} {v[s][0]}/{v[s][1]}" for s in STAMPS if v[s]) for k, v in run.items()), flush=True)
            if sink:
                sink.write(json.dumps(r) + "\n")
                sink.flush()


if __name__ == "__main__":
    main()
