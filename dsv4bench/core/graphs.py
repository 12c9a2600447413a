"""CUDA-graph timing (`dsv4bench sweep ... --bench --timing graph`): the call captured once, its replays timed.

Why (docs/lessons/harness.md 4 and 14): a decode call of several kernels (the MoE layer: dispatch, two GEMMs,
combine) spends as long in Python and launches as on the GPU, so event timing measures the host. Serving
stacks capture decode steps in CUDA graphs; a replay launches every kernel with no host work between them.

The capture must hold the whole call: before the replays are timed the evaluation (core/evaluate.py) poisons every
output the captured call returned, so a kernel left out of the graph (work done on the host at capture time, a
cached result returned without a launch) leaves poison that the timed outputs' re-validation catches. An impl that
cannot be captured (a host sync, a pageable copy) is timed by events, and the record says why.
"""

from __future__ import annotations

from typing import Callable

import torch

WARMUP_CALLS = 2  # on a side stream before the capture: lazy allocations, JIT and autotuning happen outside it


def capture(call: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`call` (its warm-up on a side stream first) captured into a CUDA graph on the current device."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize()
    return graph


def graph_replay(call: Callable[[], object]) -> tuple[Callable[[], object] | None, str]:
    """(the captured call's replay, "") or (None, why the call cannot be captured)."""
    try:
        graph = capture(call)
    except Exception as e:  # noqa: BLE001 (any capture error: the impl is timed by events instead)
        torch.cuda.synchronize()
        return None, f"not capturable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return graph.replay, ""
