"""`sweep --bench --timing graph`: a call captured once in a CUDA graph, its replays timed (core/graphs.py).

CPU: the flag is checked (one line, exit 2) and reaches every bench task. GPU (marked `gpu`): a kernel's replays are
timed and re-validated; a call that cannot be captured (a host sync) is timed by events with the reason recorded; a
call whose output comes from no captured launch fails the re-validation (its outputs are poisoned after capture).
"""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, SweepOptions, get_family, load_family
from dsv4bench.core.results import FAIL_NUMERIC, PASS
from dsv4bench.core.runner import plan
from tests.core.test_sweep_flags import in_process


@pytest.mark.parametrize("argv,message", [
    (["--bench", "--timing", "cupti"], "--timing must be one of events, graph, got 'cupti'"),
    (["--timing", "graph"], "--timing sets how --bench times a call: add --bench"),
    (["--no-kernel-split"], "--no-kernel-split drops a part of --bench's record: add --bench"),
])
def test_bad_timing_is_one_line_exit_2(argv, message, monkeypatch, capsys, tmp_path):
    code = in_process(monkeypatch, "sweep", "rmsnorm", "--examples", "0", "--out", str(tmp_path / "run"), *argv)
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 2 and len(out) == 1 and message in out[0], out
    assert not (tmp_path / "run").exists()


def test_plan_carries_the_timing_to_every_run_task():
    cases = load_family("rmsnorm").cases(SweepOptions(examples=0))[:2]
    tasks = plan(cases, ["sm_90a"], gpu=True, bench=True, compile_only=False, timing="graph")
    assert tasks and {(t.mode, t.bench, t.timing) for t in tasks} == {("run", True, "graph")}
    assert {t.timing for t in plan(cases, ["sm_90a"], gpu=True, bench=True, compile_only=False)} == {"events"}


def test_plan_carries_no_kernel_split_and_the_worker_skips_the_profile(monkeypatch):
    from dsv4bench.core import worker as worker_mod
    from dsv4bench.core.timing import TimingStats

    cases = load_family("rmsnorm").cases(SweepOptions(examples=0))[:2]
    assert {t.kernel_split for t in plan(cases, ["sm_90a"], gpu=True, bench=True, compile_only=False)} == {True}
    tasks = plan(cases, ["sm_90a"], gpu=True, bench=True, compile_only=False, kernel_split=False)
    assert tasks and {t.kernel_split for t in tasks} == {False}

    class _Copy:
        def ms(self, nbytes):
            return 0.002

    class _Ceilings:
        copy_gbps, gemm_bf16_tflops = 3000.0, 800.0

    w = worker_mod.Worker()
    w.same_traffic_copy, w.ceilings = _Copy(), _Ceilings()
    profiled = []
    monkeypatch.setattr(w, "kernel_split", lambda call: profiled.append(call) or {"kernels_total_us": 3.0})
    stats = TimingStats(0.004, 0.004, 0.004, 0.004, 0.0, 20, True, [0.004] * 20)
    outcome = type("Outcome", (), {"timing": stats, "call": "the call", "graph_error": ""})()
    cost = type("Cost", (), {"flops": 1e9, "bytes": 1e6})()
    for split in (False, True):
        rec = type("Rec", (), {})()
        w.derive_perf(rec, cost, outcome, split)
        assert ("kernels_total_us" in rec.perf) == split and rec.perf["pct_same_traffic_copy"] == 50.0
    assert profiled == ["the call"]


# --- on a GPU ------------------------------------------------------------------------------------

class _TorchRms(Impl):
    """RMSNorm in torch (the oracle's math in the input dtype), written into the guarded output."""
    family, name, backend = "rmsnorm", "test:graph", "torch"

    def run(self, case, inputs, out, compiled):
        x = inputs["x"].float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        out["out"].copy_(y * inputs["w"].float() if "w" in inputs else y)
        return {"out": out["out"]}


class _HostSync(_TorchRms):
    name = "test:host-sync"

    def run(self, case, inputs, out, compiled):
        assert float(inputs["x"].float().abs().max().item()) > 0  # a host read: not capturable
        return super().run(case, inputs, out, compiled)


class _Memo(_TorchRms):
    """Right once, then the same tensor without a launch: at capture time nothing is recorded."""
    name = "test:memo"

    def run(self, case, inputs, out, compiled):
        if not hasattr(self, "cached"):
            self.cached = super().run(case, inputs, out, compiled)["out"].clone()
        return {"out": self.cached}


def _evaluate(impl):
    from dsv4bench.core.evaluate import evaluate
    from dsv4bench.core.timing import CudaTimer

    family = get_family("rmsnorm")
    case = Case("rmsnorm", {"m": 37, "n": 4096, "dtype": "bf16", "weight": True})
    return evaluate(family, impl, case, None, device="cuda", timer=CudaTimer("cuda"), graph=True)


@pytest.mark.gpu
def test_graph_replays_are_timed_and_validated():
    outcome = _evaluate(_TorchRms())
    assert outcome.status == PASS, outcome.reason
    assert outcome.timing.mode == "graph" and outcome.graph_error == "" and outcome.timing.median_ms > 0


@pytest.mark.gpu
def test_a_call_that_syncs_is_timed_by_events_and_says_why():
    outcome = _evaluate(_HostSync())
    assert outcome.status == PASS, outcome.reason
    assert outcome.timing.mode == "events" and outcome.graph_error.startswith("not capturable: ")
    assert _evaluate(_TorchRms()).timing.mode == "graph"  # the failed capture left the context usable


@pytest.mark.gpu
def test_an_output_no_captured_kernel_writes_fails_the_timed_check():
    outcome = _evaluate(_Memo())
    assert outcome.status == FAIL_NUMERIC and outcome.reason.startswith("timed output differs"), outcome.reason
