"""The child process that compiles, runs, checks and times one task at a time.

Protocol: the parent writes one JSON task per line on stdin; the worker answers one JSON
ResultRecord per task on the file descriptor named by DSV4BENCH_RESULT_FD (never on stdout, which
kernels and libraries may write to freely: it goes to the worker's log). A hang or a crash costs
only this process: the parent kills its process group and starts a fresh worker. The worker dies
with the sweep, and what it starts dies with it (`runner.bind_worker_to_sweep`, first in `main`).

Task modes:
  compile  compile a CuTeDSL impl for one arch with fake tensors (no GPU) -> COMPILED
  check    no GPU: the low-precision reference against the FP32 oracle on the CPU -> PASS/FAIL
  run      GPU: run the impl on fresh inputs, compare with the oracle, optionally time it
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

from dsv4bench.compile.cache import CompileCache
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData, evaluate
from dsv4bench.core.registry import get_family, get_impl
from dsv4bench.core.results import (
    COMPILED, FAIL_COMPILE, FAIL_LINT, FAIL_NUMERIC, FAIL_RUNTIME, PASS, UNSUPPORTED, ResultRecord,
)
from dsv4bench.core.runner import ENV_RESULT_FD, bind_worker_to_sweep, cuda_context_lost

CPU_CHECK_MAX_BYTES = 1 << 30


HOST_BOUND_RATIO, HOST_BOUND_SLACK_US = 2.0, 5.0


def host_bound(event_us: float, kernels_us: float | None) -> bool:
    """The event-timed median is far above the device time of the call's kernels (CUPTI): the GPU
    idled waiting for the host to enqueue it (docs/lessons/harness.md, lesson 4)."""
    return bool(kernels_us) and event_us > HOST_BOUND_RATIO * kernels_us + HOST_BOUND_SLACK_US


class Worker:
    def __init__(self):
        self.cache = CompileCache()
        self.data: CaseData | None = None
        self.data_key: tuple[str, str] | None = None  # (case id, device) of `data`
        self.timer = None
        self.ceilings = None
        self.same_traffic_copy = None

    def case_data(self, family, case: Case, device: str) -> CaseData:
        if self.data is None or self.data_key != (case.id, device):
            self.data = self.data_key = None
            if device == "cuda":
                torch.cuda.empty_cache()
            self.data, self.data_key = CaseData(family, case, device), (case.id, device)
        return self.data

    def handle(self, task: dict) -> ResultRecord:
        case = Case.from_json(task["case"])
        family = get_family(case.family)
        # a CPU check runs the family's own low-precision reference, not a registered impl
        impl = None if task["mode"] == "check" else get_impl(case.family, task["impl"])
        rec = ResultRecord(
            run_id=task["run_id"], task=task["key"], case_id=case.id, family=case.family, impl=task["impl"],
            backend=impl.backend if impl else "torch", arch=task["arch"], mode=task["mode"],
            device=task.get("device", "cpu"), params=dict(case.params), seed=case.seed, origin=case.origin,
            status=UNSUPPORTED,
        )
        if impl is None:
            return self.check(rec, family, case)
        reason = impl.available() or impl.supports(case, task["arch"])
        if reason:
            rec.reason = reason
            return rec
        if task["mode"] == "compile":
            self.compile(rec, impl, case, task["arch"])
            return rec
        return self.run(rec, family, impl, case, task)

    def compile(self, rec, impl, case, arch):
        """Compile (or load) into `rec`'s status and compile info; the compiled function, or None
        when it failed to compile or a layout lint fired."""
        try:
            compiled, info = self.cache.get(impl, case, arch)
        except Exception as e:
            rec.status, rec.reason = FAIL_COMPILE, f"{type(e).__name__}: {str(e)[:300]}"
            rec.log = traceback.format_exc()[-2000:]
            return None
        rec.status, rec.compile = COMPILED, info.to_json()
        if info.lints:  # a layout lint (compile/lints.py) found a silent-bug pattern: do not run it
            rec.status, rec.reason = FAIL_LINT, "; ".join(info.lints)[:600]
            return None
        return compiled

    def check(self, rec, family, case) -> ResultRecord:
        moved = family.cost(case).bytes
        if moved > CPU_CHECK_MAX_BYTES:  # the fp32 oracle of a prefill case can take minutes and GBs
            rec.reason = f"CPU check skipped: the case moves {moved / 2**30:.1f} GiB (> 1 GiB); it is checked on a GPU"
            return rec
        data = self.case_data(family, case, "cpu")
        ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, lambda n: family.tolerance_for(case, n))
        rec.status = PASS if ok else FAIL_NUMERIC
        rec.metrics = {k: m.to_json() for k, m in metrics.items()}
        rec.reason = "; ".join(m.summary() for m in metrics.values())
        return rec

    def run(self, rec, family, impl, case, task) -> ResultRecord:
        compiled = None
        if impl.compiles:
            compiled = self.compile(rec, impl, case, task["arch"])
            if compiled is None:
                return rec
        data = self.case_data(family, case, "cuda")
        outcome = evaluate(family, impl, case, compiled, device="cuda", data=data,
                           timer=self.cuda_timer() if task.get("bench") else None,
                           graph=task.get("timing") == "graph")
        rec.status, rec.reason, rec.metrics = outcome.status, outcome.reason, outcome.metrics_json()
        if outcome.timing is not None:
            self.derive_perf(rec, family.cost(case), outcome, task.get("kernel_split", True))
        return rec

    def cuda_timer(self):
        if self.timer is None:
            from dsv4bench.core import ceilings
            from dsv4bench.core.timing import CudaTimer

            self.timer = CudaTimer("cuda")
            self.ceilings = ceilings.measure("cuda")
            self.same_traffic_copy = ceilings.SameTrafficCopy(self.timer, "cuda")
        return self.timer

    def derive_perf(self, rec, cost, outcome, split: bool = True) -> None:
        """Throughput, % of the measured ceilings and of a same-traffic copy, the per-kernel split (`split`)."""
        stats = outcome.timing
        sec = stats.median_ms / 1e3
        copy_ms = self.same_traffic_copy.ms(cost.bytes)
        rec.timing = stats.to_json()
        rec.perf = {
            "tflops": cost.flops / sec / 1e12,
            "gbps": cost.bytes / sec / 1e9,
            "pct_copy": 100.0 * cost.bytes / sec / 1e9 / self.ceilings.copy_gbps,
            "pct_gemm": 100.0 * cost.flops / sec / 1e12 / self.ceilings.gemm_bf16_tflops,
            "copy_gbps_measured": self.ceilings.copy_gbps,
            "same_traffic_copy_ms": copy_ms,  # a device copy moving cost.bytes, timed alike
            "pct_same_traffic_copy": 100.0 * copy_ms / stats.median_ms,
            "gemm_tflops_measured": self.ceilings.gemm_bf16_tflops,
        }
        if split:
            rec.perf.update(self.kernel_split(outcome.call))
        if outcome.graph_error:
            rec.perf["graph_error"] = outcome.graph_error  # timed by events instead
        if host_bound(stats.median_ms * 1e3, rec.perf.get("kernels_total_us")):
            rec.perf["host_bound"] = True  # the GPU waited for the host: the median times Python

    def kernel_split(self, call) -> dict:
        """The device µs of each kernel of one call (where the event-timed median goes)."""
        from dsv4bench.core.kernel_profile import kernel_times

        try:
            kernels = kernel_times(call, self.timer.flush)
        except Exception as e:  # no CUPTI on this host: the timing stands without the split
            return {"kernels_error": f"{type(e).__name__}: {str(e)[:200]}"}
        return {"kernels_us": kernels, "kernels_total_us": round(sum(kernels.values()), 3)}


def main() -> None:
    from dsv4bench.core.registry import load_families

    bind_worker_to_sweep()
    torch.backends.cuda.matmul.allow_tf32 = False  # the oracle is FP32, not TF32
    torch.backends.cudnn.allow_tf32 = False
    load_families()
    out = os.fdopen(int(os.environ[ENV_RESULT_FD]), "w", buffering=1)
    out.write(json.dumps({"ready": True}) + "\n")
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        print(f"=== task {task['key']}", flush=True)
        try:
            rec = worker.handle(task)
        except Exception as e:
            case = Case.from_json(task["case"])
            rec = ResultRecord(
                run_id=task["run_id"], task=task["key"], case_id=case.id, family=case.family, impl=task["impl"],
                backend="", arch=task["arch"], mode=task["mode"], device=task.get("device", "cpu"),
                params=dict(case.params), seed=case.seed, origin=case.origin, status=FAIL_RUNTIME,
                reason=f"{type(e).__name__}: {str(e)[:300]}", log=traceback.format_exc()[-2000:],
            )
        out.write(json.dumps(rec.to_json(), default=str) + "\n")
        sys.stdout.flush()
        if cuda_context_lost(rec):  # the runner starts the next task in a fresh worker
            sys.exit(3)


if __name__ == "__main__":
    main()
