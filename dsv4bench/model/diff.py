"""A backend beside the FP32 oracle model on the same tokens, op by op (`run-model --compare`).

One engine (one copy of the weights) runs twice, with two op tables:
1. the all-oracle table prefills the prompt (logits at every position) and continues greedily for
   `steps` tokens, one decode step each: its tokens are the reference continuation;
2. the candidate table (a ShadowTable) is teacher-forced on exactly those tokens, the same prefill
   and the same decode steps, so its op calls pair one to one with the oracle's.

Both runs record every op's output under the model's scope ("layer 3 attn", "mtp.0 ffn", ...):
the candidate's outputs against the oracle run's give the error that has built up to each op, its
local error (against the oracle on the same inputs) the op's own. At each continuation step each
table's sampler also picks its greedy token from its own logits: until the candidate first picks
another token, its free greedy generation would be the oracle's, so the first such step is where
the two generations diverge.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from dsv4bench.model.dispatch import OPS, OpTable
from dsv4bench.model.engine import Engine
from dsv4bench.model.error import DiffError, Error, rel_l2
from dsv4bench.model.shadow import ShadowTable


@dataclass
class Run:
    """One teacher-forced (or free greedy) run: what the diff compares."""

    tokens: list[int]  # the continuation fed
    chosen: list[int]  # the table's greedy pick at each continuation step
    logits: torch.Tensor  # [len(prompt) + steps - 1, V]: row i = the logits after i + 1 tokens
    outputs: dict[tuple[str, str], list]  # (scope, op) -> its outputs, in call order


@dataclass
class OpDiff:
    scope: str
    op: str
    backend: str
    calls: int
    error: Error  # the candidate run's outputs against the oracle run's
    local: Error | None  # against the oracle on the same inputs (candidate ops only)


@dataclass
class Divergence:
    step: int  # continuation step where the greedy tokens first differ
    oracle_token: int
    candidate_token: int
    margin: float  # oracle logit of its token minus its logit of the candidate's token (>= 0)
    spread: float  # std of the oracle's logits there, to judge the margin by


@dataclass
class Report:
    ops: list[OpDiff]  # by scope, then dataflow order
    residual: list[tuple[str, float, float]]  # (block, rel L2 error after attention, after the layer)
    positions: int  # teacher-forced positions
    top1: float  # fraction of them where the candidate's argmax is the oracle's
    logits_rel: float  # relative L2 error of the logits over every position
    steps: int
    divergence: Divergence | None  # None: the same greedy tokens for every step
    bound: Report | None = None  # the low-precision model on the same run (`compare(bound=...)`)

    def within_bound(self) -> list[bool]:
        """Per block: whether the residual stream after the layer is no further from FP32 than the
        bound's (the low-precision torch model's) on the same tokens."""
        if self.bound is None:
            raise DiffError("no bound: compare(..., bound=...) runs the low-precision model beside")
        return [mine <= theirs for (_, _, mine), (_, _, theirs) in zip(self.residual, self.bound.residual)]


def record(engine: Engine, table: OpTable, prompt: list[int], steps: int, forced: list[int] | None = None) -> Run:
    """Prefill `prompt` (all logits), then `steps` continuation steps: feed forced[i], or the table's
    greedy pick. Records every op output of the table on the engine's model."""
    if steps < 1:
        raise DiffError("a diff needs at least one continuation step")
    outputs: dict[tuple[str, str], list] = defaultdict(list)
    own = engine.ops
    engine.ops, table.trace = table, lambda scope, op, out: outputs[(scope, op)].append(out)
    try:
        engine.reset()
        rows = [engine.feed(prompt, all_logits=True).logits]
        tokens, chosen = [], []
        for i in range(steps):
            table.enter("sample")
            chosen.append(int(table.sample(rows[-1][-1], 0.0)))
            tokens.append(chosen[-1] if forced is None else forced[i])
            if i < steps - 1:
                rows.append(engine.feed([tokens[-1]]).logits[None])
    finally:
        engine.ops, table.trace = own, None
    return Run(tokens, chosen, torch.cat(rows).float(), dict(outputs))


def diff_ops(cand: Run, ref: Run, table: ShadowTable) -> list[OpDiff]:
    rows = []
    for (scope, op), refs in ref.outputs.items():
        outs = cand.outputs.get((scope, op), [])
        if len(outs) != len(refs):
            raise DiffError(f"{scope} {op}: {len(outs)} calls against the oracle's {len(refs)}")
        err = Error()
        for out, want in zip(outs, refs):
            try:
                err.add(out, want)
            except DiffError as e:
                raise DiffError(f"{scope} {op}: {e}") from None
        rows.append(OpDiff(scope, op, table.active[op], len(refs), err, table.local.get((scope, op))))
    scopes, ops = list(dict.fromkeys(r.scope for r in rows)), list(OPS)
    return sorted(rows, key=lambda r: (scopes.index(r.scope), ops.index(r.op)))  # run order, then dataflow


def residual_errors(cand: Run, ref: Run) -> list[tuple[str, float, float]]:
    """Per block ("layer 3", "mtp.0"): the relative L2 error, over every call, of the residual
    streams after its attention sublayer and after the whole layer (the hc_post outputs)."""
    after: dict[str, dict[str, Error]] = {}
    for (scope, op), refs in ref.outputs.items():
        if op == "hc_post":
            name, part = scope.rsplit(" ", 1)
            err = after.setdefault(name, {}).setdefault(part, Error())
            for out, want in zip(cand.outputs[(scope, op)], refs):
                err.add(out, want)
    return [(name, parts["attn"].rel, parts["ffn"].rel) for name, parts in after.items()]


def logits_error(cand: Run, ref: Run) -> float:
    """The relative L2 error of the logits over every teacher-forced position."""
    return rel_l2(cand.logits, ref.logits)


def divergence(cand: Run, ref: Run, prompt_len: int) -> Divergence | None:
    step = next((i for i, (c, o) in enumerate(zip(cand.chosen, ref.tokens)) if c != o), None)
    if step is None:
        return None
    row = ref.logits[prompt_len - 1 + step]
    tok, other = ref.tokens[step], cand.chosen[step]
    return Divergence(step, tok, other, (row[tok] - row[other]).item(), row.std().item())


def compare(engine: Engine, selection: dict[str, str], prompt: list[int], steps: int,
            stream_dtype: torch.dtype = torch.float32,
            bound: tuple[dict[str, str], torch.dtype] | None = None) -> Report:
    """The ops `selection` puts on other backends, with the candidate's residual streams in
    `stream_dtype`, against the all-oracle model (the engine's QAT setting on both sides). `bound`
    (a selection and its stream dtype: the low-precision model's) is diffed against the same oracle
    run and tokens, as `Report.bound`: the error a candidate is held to."""
    ref = record(engine, OpTable(), prompt, steps)
    report = _against(engine, ref, selection, prompt, steps, stream_dtype)
    if bound is not None:
        bound_selection, bound_dtype = bound
        report.bound = _against(engine, ref, bound_selection, prompt, steps, bound_dtype)
    return report


def _against(engine: Engine, ref: Run, selection: dict[str, str], prompt: list[int], steps: int,
             stream_dtype: torch.dtype) -> Report:
    table = ShadowTable(selection)
    table.stream_dtype = stream_dtype
    cand = record(engine, table, prompt, steps, forced=ref.tokens)
    agree = (cand.logits.argmax(-1) == ref.logits.argmax(-1)).double().mean().item()
    return Report(diff_ops(cand, ref, table), residual_errors(cand, ref), ref.logits.shape[0], agree,
                  logits_error(cand, ref), steps, divergence(cand, ref, len(prompt)))
