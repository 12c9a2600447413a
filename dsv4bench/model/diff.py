"""A backend beside the FP32 oracle model on the same tokens, op by op (`run-model --compare`).

One engine (one copy of the weights) runs twice, with two op tables:
1. the all-oracle table prefills the prompt (logits at every position) and continues greedily for
   `steps` tokens, one decode step each: its tokens are the reference continuation;
2. the candidate table is teacher-forced on exactly those tokens, the same prefill and the same
   decode steps, so its op calls pair one to one with the oracle's.

Both runs record every op's output under the model's scope ("layer 3", "mtp.0", ...). At each
continuation step each table's sampler also picks its greedy token from its own logits: until the
candidate first picks another token, its free greedy generation would be the oracle's, so the first
such step is where the two generations diverge.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from dsv4bench.model.dispatch import OPS, OpTable
from dsv4bench.model.engine import Engine


class DiffError(ValueError):
    pass


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
    rel: float | None  # relative L2 error of the floating outputs over every call (Error)
    mismatch: float | None  # fraction of differing rows of the integer outputs (indices, tokens)


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
    residual: list[tuple[str, float, float]]  # (scope, rel L2 error after attention, after the layer)
    positions: int  # teacher-forced positions
    top1: float  # fraction of them where the candidate's argmax is the oracle's
    logits_rel: float  # relative L2 error of the logits over every position
    steps: int
    divergence: Divergence | None  # None: the same greedy tokens for every step


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
            chosen.append(int(table.sample(rows[-1][-1].float().cpu(), 0.0)))
            tokens.append(chosen[-1] if forced is None else forced[i])
            if i < steps - 1:
                rows.append(engine.feed([tokens[-1]]).logits[None])
    finally:
        engine.ops, table.trace = own, None
    return Run(tokens, chosen, torch.cat(rows).float(), dict(outputs))


def _leaves(out) -> list[torch.Tensor]:
    """The tensors of an op output; members aligned with an index tensor (router: weights, ids)
    put in the order of the ids, row by row, since a kernel may list a row's picks in another order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if not isinstance(out, (tuple, list)):
        return []  # None: a decode step that completed no block
    ts = [t for o in out for t in _leaves(o)]
    ids = next((t for t in ts if not t.is_floating_point() and t.dim()), None)
    if ids is None:
        return ts
    order = ids.long().argsort(dim=-1)
    return [t.gather(-1, order) if t.shape == ids.shape else t for t in ts]


class Error:
    """Accumulates one op's error over its calls: the relative L2 error of the floating outputs
    (sqrt(Σ|out − ref|²) / sqrt(Σ|ref|²) over every call together, so one token's top-k flip
    does not read as a broken op) and the fraction of differing rows of the integer ones
    (index rows compared as sets: top-k is a set)."""

    def __init__(self):
        self.sq_diff = self.sq_ref = 0.0
        self.bad_rows = self.rows = 0
        self.floats = False

    def add(self, out, ref) -> None:
        got, want = _leaves(out), _leaves(ref)
        if [t.shape for t in got] != [t.shape for t in want]:
            raise DiffError(f"output shapes {[tuple(t.shape) for t in got]} differ from the oracle's "
                            f"{[tuple(t.shape) for t in want]}")
        for g, w in zip(got, want):
            if w.is_floating_point():  # masked entries (-inf scores) must match exactly
                self.floats = True
                finite = torch.isfinite(w)
                if not (torch.equal(g[~finite], w[~finite]) and torch.isfinite(g[finite]).all()):
                    self.sq_diff = math.inf
                self.sq_diff += (g[finite].double() - w[finite].double()).square().sum().item()
                self.sq_ref += w[finite].double().square().sum().item()
            else:
                width = w.shape[-1] if w.dim() > 1 else 1
                g, w = g.long().reshape(-1, width), w.long().reshape(-1, width)
                self.bad_rows += (g.sort(-1).values != w.sort(-1).values).any(-1).sum().item()
                self.rows += w.shape[0]

    @property
    def rel(self) -> float | None:
        if not self.floats:
            return None
        return (self.sq_diff / self.sq_ref) ** 0.5 if self.sq_ref > 0 else self.sq_diff ** 0.5

    @property
    def mismatch(self) -> float | None:
        return self.bad_rows / self.rows if self.rows else None


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    e = Error()
    e.add(out, ref)
    return e.rel


def diff_ops(cand: Run, ref: Run, table: OpTable) -> list[OpDiff]:
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
        rows.append(OpDiff(scope, op, table.active[op], len(refs), err.rel, err.mismatch))
    scopes, ops = list(dict.fromkeys(r.scope for r in rows)), list(OPS)
    return sorted(rows, key=lambda r: (scopes.index(r.scope), ops.index(r.op)))  # run order, then dataflow


def residual_errors(cand: Run, ref: Run) -> list[tuple[str, float, float]]:
    """Per block scope: the relative L2 error of the residual streams after its attention
    sublayer and after the whole layer, over every call (a block's hc_post calls alternate
    attention, FFN)."""
    rows = []
    for (scope, op), refs in ref.outputs.items():
        if op != "hc_post":
            continue
        outs, after = cand.outputs[(scope, op)], (Error(), Error())
        for i, (out, want) in enumerate(zip(outs, refs)):
            after[i % 2].add(out, want)
        rows.append((scope, after[0].rel, after[1].rel))
    return rows


def divergence(cand: Run, ref: Run, prompt_len: int) -> Divergence | None:
    step = next((i for i, (c, o) in enumerate(zip(cand.chosen, ref.tokens)) if c != o), None)
    if step is None:
        return None
    row = ref.logits[prompt_len - 1 + step]
    tok, other = ref.tokens[step], cand.chosen[step]
    return Divergence(step, tok, other, (row[tok] - row[other]).item(), row.std().item())


def logits_error(cand: Run, ref: Run) -> float:
    """The relative L2 error of the logits over every teacher-forced position."""
    return rel_l2(cand.logits, ref.logits)


def compare(engine: Engine, candidate: OpTable, prompt: list[int], steps: int) -> Report:
    """The candidate table against the all-oracle one (the engine's QAT setting on both sides)."""
    ref = record(engine, OpTable(), prompt, steps)
    cand = record(engine, candidate, prompt, steps, forced=ref.tokens)
    agree = (cand.logits.argmax(-1) == ref.logits.argmax(-1)).double().mean().item()
    return Report(diff_ops(cand, ref, candidate), residual_errors(cand, ref), ref.logits.shape[0], agree,
                  logits_error(cand, ref), steps, divergence(cand, ref, len(prompt)))
