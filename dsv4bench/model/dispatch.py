"""The op dispatch table of the reference model (documented in docs/model.md).

Every op the model composition (`oracles/model.py`) calls goes through one `OpTable`: a name
("rmsnorm", "sparse_attention", "expert", ...) mapped to the implementation in use. The FP32
oracle of each op is registered as backend "oracle" and is the default. A kernel registers an
alternative with the oracle's signature:

    from dsv4bench.model.dispatch import register_op
    register_op("rmsnorm", "cutedsl", my_rmsnorm)      # same signature and meaning as the oracle

and a run selects it per op (`OpTable.select({"rmsnorm": "cutedsl"})`) or for every op that has it
(`OpTable.select_all("cutedsl")`), so each layer can be diffed against FP32 one op at a time.
Calls are counted and timed per op, which `run-model` reports; `OpTable.trace`, when set, sees
every call's output under the scope the model last announced (`OpTable.enter`), which the diffs
of `run-model --compare` / `--bisect` (dsv4bench/model/diff.py) record.

Kernel families need no call here: each declares the ops it serves (`Family.serves`) and
`register_kernel_ops()` registers them as backend "cutedsl" (dsv4bench/model/kernel_ops.py).
An op no family serves is on `ORACLE_ONLY`, with the reason (tests/model/test_op_table.py keeps
the two complementary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from dsv4bench.core.registry import Unsupported
from oracles import model as oracle_model

ORACLE = "oracle"


@dataclass(frozen=True)
class OpInfo:
    name: str
    oracle: Callable
    doc: str


# The ops of the model, their FP32 oracle and a one-line contract (the oracle's docstring has the
# full signature). The order is the order of the dataflow.
OPS: dict[str, OpInfo] = {
    name: OpInfo(name, fn, doc) for name, (fn, doc) in oracle_model.ORACLE_OPS.items()
}

# The ops no kernel family serves yet (Family.serves), each with why. An op leaves this list the
# day a family serves it (tests/model/test_op_table.py fails until it does).
ORACLE_ONLY: dict[str, str] = {
}


# The residual streams' dtype of a backend's model, where not fp32 (`select_all` applies it): the
# low-precision model keeps them in bf16 as the official inference does (lowprec_ops.py).
STREAM_DTYPES: dict[str, torch.dtype] = {}

# backend name -> implementation, per op; kernels add entries through register_op.
_REGISTRY: dict[str, dict[str, Callable]] = {name: {ORACLE: info.oracle} for name, info in OPS.items()}


class DispatchError(KeyError):
    pass


def register_op(op: str, backend: str, fn: Callable) -> None:
    """Register `fn` as backend `backend` of op `op` (it must match the oracle's signature)."""
    if op not in _REGISTRY:
        raise DispatchError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    if backend == ORACLE:
        raise DispatchError("the 'oracle' backend is reserved for the FP32 oracles")
    _REGISTRY[op][backend] = fn


def register_kernel_ops() -> dict[str, str]:
    """Register every op a kernel family serves as backend "cutedsl"; op -> what serves it."""
    from dsv4bench.model.kernel_ops import KERNEL, served_ops

    served = served_ops()
    for op, kernel_op in served.items():
        register_op(op, KERNEL, kernel_op)
    return {op: k.describe() for op, k in served.items()}


def has_backend(op: str, backend: str) -> bool:
    return backend in _REGISTRY[op]


def serving_table(backend: str) -> list[tuple[str, str]]:
    """(op, what runs it under `backend`) for every op, in dataflow order: a registered
    implementation's description, or "oracle (...)" with the reason the op has none."""
    from dsv4bench.model.kernel_ops import KERNEL

    rows = []
    for op in OPS:
        fn = _REGISTRY[op].get(backend)
        if fn is None:
            why = ORACLE_ONLY[op] if backend == KERNEL and op in ORACLE_ONLY else f"no {backend!r} implementation"
            rows.append((op, f"oracle ({why})"))
        else:
            rows.append((op, fn.describe() if hasattr(fn, "describe") else "registered"))
    return rows


class OpTable:
    """The implementations one model run uses, with per-op call counts and wall time."""

    def __init__(self, selection: Mapping[str, str] | None = None):
        self.active: dict[str, str] = {op: ORACLE for op in OPS}
        self.calls: dict[str, int] = dict.fromkeys(OPS, 0)
        self.seconds: dict[str, float] = dict.fromkeys(OPS, 0.0)
        self.scope = ""  # the part of the model running now (enter)
        self.refused: dict[str, tuple[int, str]] = {}  # op -> (calls its kernel refused, the first reason)
        self.trace: Callable[[str, str, object], None] | None = None  # (scope, op, output) of every call
        self.stream_dtype = torch.float32  # the model's residual streams (oracles/model.py forward)
        if selection:
            self.select(selection)

    def enter(self, scope: str) -> None:
        """The model announces the part it runs next: "embed", "layer 3 attn", "layer 3 ffn", "head"..."""
        self.scope = scope

    def select(self, selection: Mapping[str, str]) -> "OpTable":
        for op, backend in selection.items():
            if op not in _REGISTRY:
                raise DispatchError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
            if backend not in _REGISTRY[op]:
                raise DispatchError(f"op {op!r} has no backend {backend!r} (has {', '.join(_REGISTRY[op])})")
            self.active[op] = backend
        return self

    def select_all(self, backend: str) -> "OpTable":
        """Use `backend` for every op that has it; the others stay on the oracle."""
        chosen = {op: backend for op in OPS if backend in _REGISTRY[op]}
        if not chosen:
            known = sorted({b for impls in _REGISTRY.values() for b in impls})
            raise DispatchError(f"no op has a backend {backend!r} (registered: {', '.join(known)})")
        self.stream_dtype = STREAM_DTYPES.get(backend, torch.float32)
        return self.select(chosen)

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in OPS:
            raise AttributeError(op)
        fn = _REGISTRY[op][self.active[op]]

        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                try:
                    out = fn(*args, **kwargs)
                except Unsupported as e:  # a kernel that does not take this call's shape: the oracle runs it
                    if self.active[op] == ORACLE:
                        raise
                    n, first = self.refused.get(op, (0, str(e)))
                    self.refused[op] = (n + 1, first)
                    out = _REGISTRY[op][ORACLE](*args, **kwargs)
            finally:
                self.calls[op] += 1
                self.seconds[op] += time.perf_counter() - t0
            if self.trace is not None:
                self.trace(self.scope, op, out)
            return out

        return call

    def report(self) -> list[tuple[str, str, int, float]]:
        """(op, backend, calls, seconds) for every op, in dataflow order."""
        return [(op, self.active[op], self.calls[op], self.seconds[op]) for op in OPS]
