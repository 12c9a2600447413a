"""Where a moe layer call's time goes: each of its launches timed alone, and the whole call, in one process.

    python3 benchmarks/moe_stages.py --model flash --experts 256 --tokens 1,8,64 --impl cutedsl --out stages.jsonl
    ncu --kernel-name regex:GroupedL1Row --launch-skip 1 --launch-count 1 python3 benchmarks/moe_stages.py --once ...

One call of the impl runs with its launches recorded (dispatch's two kernels, L1, L2, combine: whatever the
compiled layer's kernels and GEMMs are); each recorded launch is then replayed alone in a CUDA graph, and the whole
call in another, every replay timed by CUDA events with the L2 flushed before it (the sweep's `--timing graph`). The
whole call's output is checked against the FP32 oracle first (a knock-out's is not). A stage's time alone includes its
own launch and ramp; the whole call's time against the stages' sum is what programmatic dependent launch overlaps. A
peer (`deepgemm-kernels`, ...) compiles nothing here: its call is checked and timed whole, no stages. Prints one line
a case and writes one JSON record a case (µs)."""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.deadline import case_deadline
from dsv4bench.core.evaluate import case_generator
from dsv4bench.core.graphs import capture
from dsv4bench.core.registry import get_impl, load_families
from dsv4bench.core.timing import CudaTimer
from kernels.moe.family import FAMILY
from sweeps.moe import LOADS, MODELS
from sweeps.moe import case as moe_case


class Recorder:
    """The compiled layer with every launch recorded as (name, callable, args) in `launches`; the rest delegated."""

    def __init__(self, compiled):
        self._compiled = compiled
        self.launches: list = []
        self.kernels = {name: self._wrap(name, fn) for name, fn in compiled.kernels.items()}

    def _wrap(self, name, fn):
        def call(*args):
            self.launches.append((name, fn, args))
            return fn(*args)
        return call

    def gemms(self, *args, **kwargs):
        l1, l2, order = self._compiled.gemms(*args, **kwargs)
        return self._wrap("l1", l1), self._wrap("l2", l2), order

    def __getattr__(self, name):
        return getattr(self._compiled, name)


VERDICT = {True: "PASS", False: "FAIL", None: "knock-out, not compared"}


def graph_us(timer: CudaTimer, call) -> float:
    return timer.time(capture(call).replay).median_ms * 1e3


def prepare(impl_name: str, params: dict):
    """(impl, case, inputs, outputs) of one layer case, or the impl's refusal (a string)."""
    impl = get_impl("moe", impl_name)
    case = Case("moe", params, seed=0, origin="cli")
    refused = impl.supports(case, "sm_90a")
    if refused:
        return refused
    return impl, case, FAMILY.make_inputs(case, case_generator(case), "cuda"), FAMILY.alloc_outputs(case, "cuda")


def compiled_or_none(impl, case):
    """Our impls' compiled layer; None for a peer (it compiles nothing here: its call is timed whole, no stages)."""
    return impl.compile(case, "sm_90a") if impl.compiles else None


def stages(impl_name: str, params: dict, timer: CudaTimer) -> dict:
    ready = prepare(impl_name, params)
    if isinstance(ready, str):
        return {"impl": impl_name, "params": params, "skipped": ready}
    impl, case, inputs, out = ready
    compiled = compiled_or_none(impl, case)
    rec = Recorder(compiled) if compiled is not None else None  # a peer's launches are not ours to record
    impl.run(case, inputs, out, rec)
    torch.cuda.synchronize()
    passed = None  # a knock-out's output is wrong by design: not compared
    if impl.checked:
        passed, _ = compare_outputs(out, FAMILY.oracle(case, inputs), FAMILY.lowprec(case, inputs),
                                    lambda name: FAMILY.tolerance_for(case, name))
    launches = list(rec.launches) if rec is not None else []
    whole = graph_us(timer, lambda: impl.run(case, inputs, out, compiled))
    alone = {}
    for n, (name, fn, args) in enumerate(launches):
        alone[f"{n}:{name}"] = round(graph_us(timer, lambda fn=fn, args=args: fn(*args)), 2)
    return {"impl": impl_name, "params": params, "passed": passed,
            "whole_us": round(whole, 2), "alone_us": alone, "alone_sum_us": round(sum(alone.values()), 2)}


def once(impl_name: str, params: dict) -> str | None:
    """`--once`: the case's call twice (compile and warm, then the one to profile), nothing timed: for ncu
    (`--launch-skip` past the first call's kernels). Peers too. Returns the impl's refusal, if it refuses the case."""
    ready = prepare(impl_name, params)
    if isinstance(ready, str):
        return ready
    impl, case, inputs, out = ready
    compiled = compiled_or_none(impl, case)
    for _ in range(2):
        impl.run(case, inputs, out, compiled)
    torch.cuda.synchronize()


def layer_parser(doc: str, tokens: str, record: str) -> argparse.ArgumentParser:
    """The options shared with benchmarks/moe_phases.py (`layer_args` checks them)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="flash", choices=sorted(MODELS))
    ap.add_argument("--experts", type=int, default=None, help="the layer's experts (default: the sweep's cap)")
    ap.add_argument("--tokens", default=tokens, help="comma-separated token counts")
    ap.add_argument("--out", default=None, help=f"JSONL file, one record a {record}, appended as each ends")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help=f"seconds a {record} may take, its compiles included, before the process ends (0: none)")
    return ap


def layer_args(ap: argparse.ArgumentParser, max_tokens: int | None = None) -> tuple:
    """(the parsed options, the token counts), or one parser error line for a bad value."""
    a = ap.parse_args()
    try:
        tokens = [int(v) for v in a.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens takes comma-separated integers, got {a.tokens!r}")
    if bad := [t for t in tokens if not 1 <= t <= (max_tokens or t)]:
        ap.error(f"--tokens must be {f'1..{max_tokens}' if max_tokens else '>= 1'}, got {bad}")
    if a.experts is not None and not 1 <= a.experts <= MODELS[a.model][0]:
        ap.error(f"--experts must be 1..{MODELS[a.model][0]} for {a.model}, got {a.experts}")
    if a.timeout < 0:
        ap.error(f"--timeout must be >= 0, got {a.timeout}")
    return a, tokens


def main() -> None:
    ap = layer_parser(__doc__, "1,8,64", "(case, impl)")
    ap.add_argument("--load", default="uniform", help=f"comma-separated, of {', '.join(LOADS)}")
    ap.add_argument("--impl", action="append", default=None, help="repeatable (default: cutedsl)")
    ap.add_argument("--once", action="store_true", help="each call twice, untimed (for ncu; peers included)")
    a, tokens = layer_args(ap)
    loads = a.load.split(",")
    if bad := [v for v in loads if v not in LOADS]:
        ap.error(f"unknown loads: {', '.join(bad)} (loads: {', '.join(LOADS)})")
    load_families()
    try:
        names = [get_impl("moe", n).name for n in a.impl or ["cutedsl"]]
    except KeyError as e:
        ap.error(str(e).strip("'\""))
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times the kernels)")
    timer = CudaTimer("cuda")
    with open(a.out, "a") if a.out else contextlib.nullcontext() as sink:
        for t in tokens:
            for load in loads:
                params = moe_case("layer", a.model, t, load, e=a.experts)
                for name in names:
                    with case_deadline(a.timeout, f"{a.model} e={params['e']} T={t} {load} {name}"):
                        r = {"skipped": once(name, params)} if a.once else stages(name, params, timer)
                    if r.get("skipped"):
                        print(f"{a.model} e={params['e']} T={t} {load} {name}: skipped: {r['skipped']}", flush=True)
                    if a.once or "skipped" in r:
                        continue
                    stages_s = " ".join(f"{k} {v}" for k, v in r["alone_us"].items())
                    print(f"{a.model} e={params['e']} T={t} {load} {name}: whole {r['whole_us']} us, alone: "
                          f"{stages_s} (sum {r['alone_sum_us']}) {VERDICT[r['passed']]}", flush=True)
                    if sink:
                        sink.write(json.dumps(r) + "\n")
                        sink.flush()


if __name__ == "__main__":
    main()
