"""The one evaluation path: every "run the impl, compare with the oracle" goes through `evaluate`.

The sweep worker, `repro`, the GPU test fixture (tests/conftest.py: `gpu_check`) and the timing of
declared variants all call it, so a guard added here holds everywhere:

1. inputs built once per case from a seed derived from the case id (`CaseData`);
2. outputs NaN-poisoned (an unwritten element fails) and placed between canary pads (a store past
   either end of an output fails);
3. inputs snapshotted and checked unchanged after the call;
4. the result compared with the FP32 oracle by the family's tolerance (core/compare.py), unless the
   impl is a knock-out (`checked = False`: status UNCHECKED);
5. optionally timed (a `timer` with `.time(call)`; with `graph`, the replays of the call captured in a CUDA
   graph, its outputs poisoned again after the capture), and the timed outputs validated again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import ErrorMetrics, compare_outputs
from dsv4bench.core.graphs import graph_replay
from dsv4bench.core.registry import Family, Impl, Unsupported
from dsv4bench.core.results import FAIL_NUMERIC, PASS, UNCHECKED, UNSUPPORTED

POISON_INT = -7  # integer outputs are filled with this before a run
CANARY_FLOAT = 7.0  # the pads around float outputs (NaN would hide a kernel that writes NaN there)
PAD_ELEMENTS = 4096  # per side; a multiple of 16 bytes for every dtype, so alignment is kept


def case_generator(case: Case) -> torch.Generator:
    """The seeded CPU generator of a case's inputs: the same case id gives the same inputs."""
    seed = int(hashlib.sha256(case.id.encode()).hexdigest()[:15], 16)
    return torch.Generator(device="cpu").manual_seed(seed)


def poison(outputs: dict) -> None:
    """NaN-fill float outputs (an unwritten element then fails); a sentinel for integer ones."""
    for t in outputs.values():
        t.fill_(float("nan") if t.dtype.is_floating_point else POISON_INT)


class CaseData:
    """Inputs, oracle and low-precision reference of one case, kept while its impls run."""

    def __init__(self, family: Family, case: Case, device: str):
        self.case_id = case.id
        self.inputs = family.make_inputs(case, case_generator(case), device)
        self.oracle = family.oracle(case, self.inputs)
        self.lowprec = family.lowprec(case, self.inputs)


@dataclass
class GuardedOutputs:
    """Output views placed inside slabs with canary pads on both sides."""

    views: dict
    slabs: dict = field(default_factory=dict)  # name -> (slab, numel)

    @classmethod
    def allocate(cls, family: Family, case: Case, device: str) -> "GuardedOutputs":
        views, slabs = {}, {}
        for name, t in family.alloc_outputs(case, device).items():
            if not t.is_contiguous() or t.dim() == 0:  # no room to guard: poisoned only
                poison({name: t})
                views[name] = t
                continue
            slab = torch.empty(t.numel() + 2 * PAD_ELEMENTS, dtype=t.dtype, device=t.device)
            slab.fill_(CANARY_FLOAT if t.dtype.is_floating_point else POISON_INT)
            views[name] = slab[PAD_ELEMENTS:PAD_ELEMENTS + t.numel()].view(t.shape)
            poison({name: views[name]})
            slabs[name] = slab
        return cls(views, slabs)

    def overwritten(self) -> list[str]:
        """Names of outputs whose canary pads were written."""
        bad = []
        for name, slab in self.slabs.items():
            pads = torch.cat([slab[:PAD_ELEMENTS], slab[-PAD_ELEMENTS:]])
            sentinel = CANARY_FLOAT if slab.dtype.is_floating_point else POISON_INT
            if not bool((pads == torch.full_like(pads, sentinel)).all()):
                bad.append(name)
        return bad


@dataclass
class Outcome:
    """What one evaluation found. `result` holds the impl's outputs (for diagnostics)."""

    status: str
    reason: str = ""
    metrics: dict[str, ErrorMetrics] = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    timing: Any = None  # the timer's stats, when timed
    graph_error: str = ""  # why a call asked to be timed as a CUDA graph could not be captured
    call: Callable[[], Any] | None = None  # the timed call, for a per-kernel split afterwards

    @property
    def passed(self) -> bool:
        return self.status in (PASS, UNCHECKED)

    def metrics_json(self) -> dict:
        return {k: m.to_json() for k, m in self.metrics.items()}


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _check(family: Family, impl: Impl, case: Case, data: CaseData, result: dict) -> tuple[str, str, dict]:
    if not impl.checked:
        return UNCHECKED, "knock-out variant: output not compared", {}
    ok, metrics = compare_outputs(result, data.oracle, data.lowprec, lambda n: family.tolerance_for(case, n))
    return (PASS if ok else FAIL_NUMERIC), "; ".join(m.summary() for m in metrics.values()), metrics


def evaluate(family: Family, impl: Impl, case: Case, compiled: Any, *, device: str = "cuda",
             data: CaseData | None = None, timer: Any = None, graph: bool = False) -> Outcome:
    """Run `impl` once on the case's inputs and judge it; with `timer`, time it and judge again. `graph`: time
    the replays of the call captured in a CUDA graph (core/graphs.py), its outputs poisoned after the capture;
    a call that cannot be captured is timed by events (Outcome.graph_error says why)."""
    data = data or CaseData(family, case, device)
    guarded = GuardedOutputs.allocate(family, case, device)
    before = {k: v.clone() for k, v in data.inputs.items()}
    try:
        result = impl.run(case, data.inputs, guarded.views, compiled)
    except Unsupported as e:
        return Outcome(UNSUPPORTED, str(e))
    _synchronize(device)
    status, reason, metrics = _check(family, impl, case, data, result)
    problems = [f"input {k} modified" for k, v in data.inputs.items() if not torch.equal(v, before[k])]
    problems += [f"a store ran past output {k}" for k in guarded.overwritten()]
    if problems:
        status, reason = FAIL_NUMERIC, "; ".join(problems) + ("; " + reason if reason else "")
    outcome = Outcome(status, reason, metrics, result)
    if timer is None or not outcome.passed:
        return outcome
    holder = {}

    def call():
        holder["r"] = impl.run(case, data.inputs, guarded.views, compiled)

    timed = call
    if graph:
        timed, outcome.graph_error = graph_replay(call)
        if timed is None:
            timed = call
        else:  # only the replays can now make the outputs pass
            held = {t.untyped_storage().data_ptr() for t in data.inputs.values() if isinstance(t, torch.Tensor)}
            poison({k: t for k, t in holder["r"].items()
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held})
    outcome.timing, outcome.call = timer.time(timed), call
    outcome.timing.mode = "graph" if timed is not call else "events"
    _synchronize(device)
    status, reason, metrics = _check(family, impl, case, data, holder["r"])
    if status == FAIL_NUMERIC:  # the timed outputs are validated too
        outcome.status, outcome.reason, outcome.metrics = status, "timed output differs: " + reason, metrics
    return outcome
