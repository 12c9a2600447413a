"""How far an op's output is from the oracle's, accumulated over calls (the diffs of `run-model
--compare` and `--bisect`).

Floating outputs: the relative L2 error sqrt(Σ|out − ref|²) / sqrt(Σ|ref|²) over every call
together, so one token whose top-k set flipped does not read as a broken op; entries the oracle
masks (−inf scores) must match exactly. Integer outputs (top-k ids, expert ids, tokens): the
fraction of rows that differ, each row compared as a set (a top-k is a set, and a kernel may list a
row's picks in another order — members aligned with the ids, the router's weights, follow them).
"""

from __future__ import annotations

import math

import torch


class DiffError(ValueError):
    pass


def _leaves(out) -> list[torch.Tensor]:
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
            g = g.to(w.device)  # the sampler's oracle answers on the CPU (its noise is drawn there)
            if w.is_floating_point():  # masked entries (-inf scores) must match exactly
                self.floats = True
                finite = torch.isfinite(w)
                if not (torch.equal(g[~finite], w[~finite]) and torch.isfinite(g[finite]).all()):
                    self.sq_diff = math.inf
                self.sq_diff += (g[finite].double() - w[finite].double()).square().sum().item()
                self.sq_ref += w[finite].double().square().sum().item()
            elif w.numel():  # (a top-k before any entry exists is empty)
                width = w.shape[-1] if w.dim() > 1 else 1
                g, w = g.long().reshape(-1, width), w.long().reshape(-1, width)
                self.bad_rows += (g.sort(-1).values != w.sort(-1).values).any(-1).sum().item()
                self.rows += w.shape[0]

    def merge(self, other: "Error") -> "Error":
        self.sq_diff += other.sq_diff
        self.sq_ref += other.sq_ref
        self.bad_rows += other.bad_rows
        self.rows += other.rows
        self.floats |= other.floats
        return self

    @property
    def rel(self) -> float | None:
        if not self.floats:
            return None
        return math.sqrt(self.sq_diff / self.sq_ref) if self.sq_ref > 0 else math.sqrt(self.sq_diff)

    @property
    def mismatch(self) -> float | None:
        return self.bad_rows / self.rows if self.rows else None

    @property
    def worst(self) -> float:
        return max(self.rel or 0.0, self.mismatch or 0.0)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    e = Error()
    e.add(out, ref)
    return e.rel
