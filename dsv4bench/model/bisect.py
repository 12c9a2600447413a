"""Which op makes a backend's model wrong (`run-model --bisect`).

Every op the candidate backend implements is switched to it alone, in dataflow order, with every
other op on its FP32 oracle, teacher-forced on the oracle's own greedy continuation (diff.record).
Its error is the worst of: the relative L2 error of the residual stream after any layer (MTP
included), that of the logits, and the fraction of greedy picks that differ although the logits
they were picked from are the same (the sampler's own error; a pick that flips because the logits
moved is the logits' error already). The same
op with its oracle's output rounded to bf16 (backend "oracle-bf16") sets what one bf16 rounding of
that op costs the model — its floor. An op's error *jumps* when it exceeds `factor` times its floor
(floors below FLOOR count as FLOOR, so exact-integer ops such as the top-k are held to ~1e-5); the
first op in dataflow order that jumps is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bench.model.diff import Run, logits_error, record, residual_errors
from dsv4bench.model.dispatch import BF16, OPS, OpTable, has_backend
from dsv4bench.model.engine import Engine

FLOOR = 1e-6
JUMP_FACTOR = 10.0


@dataclass
class OpVerdict:
    op: str
    error: float  # the model's error with only this op on the candidate backend
    floor: float  # the same with only this op's output rounded to bf16
    jumps: bool


def model_error(cand: Run, ref: Run) -> float:
    """The worst residual-stream, logits and greedy-pick error of a teacher-forced run."""
    resid = max((after for _, _, after in residual_errors(cand, ref)), default=0.0)
    steps = len(ref.chosen)  # pick i came from logits row -steps + i
    same = (cand.logits[-steps:] == ref.logits[-steps:]).all(-1).tolist()
    picks = sum(c != r and s for c, r, s in zip(cand.chosen, ref.chosen, same)) / steps
    return max(resid, logits_error(cand, ref), picks)


def bisect(engine: Engine, backend: str, prompt: list[int], steps: int,
           factor: float = JUMP_FACTOR) -> tuple[list[OpVerdict], str | None]:
    """(a verdict per op `backend` implements, in dataflow order; the first op that jumps or None)."""
    ops = [op for op in OPS if has_backend(op, backend)]
    if not ops:
        raise ValueError(f"no op has a backend {backend!r}")
    ref = record(engine, OpTable(), prompt, steps)
    verdicts = []
    for op in ops:
        error = model_error(record(engine, OpTable({op: backend}), prompt, steps, ref.tokens), ref)
        floor = model_error(record(engine, OpTable({op: BF16}), prompt, steps, ref.tokens), ref) if error else 0.0
        verdicts.append(OpVerdict(op, error, floor, error > factor * max(floor, FLOOR)))
    return verdicts, next((v.op for v in verdicts if v.jumps), None)
