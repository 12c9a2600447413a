"""Which op makes a backend's model wrong (`run-model --bisect`).

Every op the candidate backend implements is switched to it alone, in dataflow order, every other
op on its FP32 oracle, teacher-forced on the oracle's own greedy continuation (diff.record). At
each of its calls the op's oracle runs beside it on the same inputs (shadow.ShadowTable): the op's
error is its local error over the run — relative L2 for floating outputs, the fraction of rows that
differ for indices and tokens — and its floor the error of its oracle's output rounded to bf16.
An op's error *jumps* when it exceeds `factor` times its floor (floors below FLOOR count as FLOOR,
so exact-integer ops such as the top-k are held to ~1e-5); the first op in dataflow order that
jumps is named. Each verdict also carries the model's error with that op switched: the worst
residual stream after any layer, or the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bench.model.diff import logits_error, record, residual_errors
from dsv4bench.model.dispatch import OPS, OpTable, has_backend
from dsv4bench.model.engine import Engine
from dsv4bench.model.shadow import ShadowTable

FLOOR = 1e-6
JUMP_FACTOR = 10.0


@dataclass
class OpVerdict:
    op: str
    error: float  # the op's local error (against its oracle on the same inputs)
    floor: float  # the error of its oracle's output rounded to bf16
    model: float  # the model's error with only this op switched (residual streams, logits)
    jumps: bool


def bisect(engine: Engine, backend: str, prompt: list[int], steps: int,
           factor: float = JUMP_FACTOR) -> tuple[list[OpVerdict], str | None]:
    """(a verdict per op `backend` implements, in dataflow order; the first op that jumps or None)."""
    ops = [op for op in OPS if has_backend(op, backend)]
    if not ops:
        raise ValueError(f"no op has a backend {backend!r}")
    ref = record(engine, OpTable(), prompt, steps)
    verdicts = []
    for op in ops:
        table = ShadowTable({op: backend})
        cand = record(engine, table, prompt, steps, ref.tokens)
        local, floor = (e.worst for e in table.op_errors(op))
        model = max([logits_error(cand, ref)] + [after for _, _, after in residual_errors(cand, ref)])
        verdicts.append(OpVerdict(op, local, floor, model, local > factor * max(floor, FLOOR)))
    return verdicts, next((v.op for v in verdicts if v.jumps), None)
