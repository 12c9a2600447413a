"""End-to-end speed of the model on one backend against others, in one process (`dsv4bench
bench-model`, docs/perf/model.md): a prefill of N tokens at batch B, then D greedy decode steps, timed
per phase and per op.

Per op, CUDA events are recorded around each call on the stream (no synchronisation: the model's own
host reads — positions, compressor emissions — are the only syncs); the events are read once per phase,
after one synchronisation. A phase's time is the events around the whole phase, so the per-op times
and the glue between ops (caches, gathers, the engine) add up to it. On the CPU the same tables time
with perf_counter. Every backend first runs the whole prefill and decode once untimed, so kernel
compilation (some configurations depend on the growing key count) and first-call allocations are
not timed.

Records (`run`): per backend and phase, tokens, seconds, tokens/s and per op (calls, ms, share of the
phase); per baseline and phase, the speedup of the first backend (baseline seconds / its seconds).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from dsv4bench.model.dispatch import OpTable
from dsv4bench.model.engine import Engine

PHASES = ("prefill", "decode")


class Clock:
    """A pair of marks: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else 1e3 * (end - start)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class TimedTable(OpTable):
    """An op table that marks the start and end of every op call under the current `phase`."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock, self.phase = clock, "warmup"
        self.marks: dict[tuple[str, str], list] = defaultdict(list)

    def __getattr__(self, op: str):
        call = super().__getattr__(op)

        def timed(*args, **kwargs):
            start = self.clock.mark()
            out = call(*args, **kwargs)
            self.marks[(self.phase, op)].append((start, self.clock.mark()))
            return out

        return timed

    def op_ms(self, phase: str) -> dict[str, tuple[int, float]]:
        """op -> (calls, ms) in `phase` (after a sync), in first-call order."""
        return {op: (len(m), sum(self.clock.ms(*pair) for pair in m))
                for (ph, op), m in self.marks.items() if ph == phase}


@dataclass
class PhaseResult:
    backend: str
    phase: str
    tokens: int
    seconds: float
    ops: dict[str, tuple[int, float]] = field(default_factory=dict)  # op -> (calls, ms)

    def record(self, meta: dict) -> dict:
        total_ms = 1e3 * self.seconds
        return dict(meta, kind="phase", backend=self.backend, phase=self.phase, tokens=self.tokens,
                    seconds=self.seconds, tokens_per_s=self.tokens / self.seconds,
                    ops={op: {"calls": n, "ms": ms, "share": ms / total_ms} for op, (n, ms) in self.ops.items()})


def _drive(engine: Engine, table: TimedTable, ids: torch.Tensor, decode: int, timed: bool) -> dict[str, float]:
    """Prefill ids [B, N], then `decode` greedy steps through the table's sampler; ms per phase."""
    clock, ms, logits = table.clock, {}, None
    engine.reset(ids.shape[0])
    for phase in PHASES:
        table.phase = phase if timed else "warmup"
        clock.sync()
        start = clock.mark()
        if phase == "prefill":
            logits = engine.feed(ids).logits
        else:
            for _ in range(decode):
                logits = engine.feed(table.sample(logits, 0.0).reshape(-1, 1).to(ids.device)).logits
        end = clock.mark()
        clock.sync()
        ms[phase] = clock.ms(start, end)
    return ms


def measure(engine: Engine, table: TimedTable, backend: str, ids: torch.Tensor, decode: int) -> list[PhaseResult]:
    """A warm-up, then the timed prefill and decode of one backend's table on the engine's weights."""
    own = engine.ops
    engine.ops = table
    try:
        _drive(engine, table, ids, decode, timed=False)
        ms = _drive(engine, table, ids, decode, timed=True)
    finally:
        engine.ops = own
    batch, n = ids.shape
    return [PhaseResult(backend, phase, batch * (n if phase == "prefill" else decode), ms[phase] / 1e3,
                        table.op_ms(phase)) for phase in PHASES]


def speedups(results: list[PhaseResult], meta: dict) -> list[dict]:
    """The first backend against each other one, per phase: baseline seconds / its seconds."""
    first = results[0].backend
    mine = {r.phase: r for r in results if r.backend == first}
    return [dict(meta, kind="speedup", backend=first, baseline=r.backend, phase=r.phase,
                 speedup=r.seconds / mine[r.phase].seconds)
            for r in results if r.backend != first]
