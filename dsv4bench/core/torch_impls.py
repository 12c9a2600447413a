"""The torch baselines every family is timed against: its math as plain torch ops, run eagerly
("torch") or compiled once per process by torch.compile ("torch_compile").

A family gives the function(s) and how to call them for a case; this module owns the rest.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, register_impl

# call(fns, case, inputs) -> outputs, where fns is the family's function (or a dict of them),
# eager or compiled
Call = Callable[[object, Case, dict], dict]


def _compile(fns):
    if isinstance(fns, Mapping):
        return {name: torch.compile(fn, dynamic=False) for name, fn in fns.items()}
    return torch.compile(fns, dynamic=False)


class TorchBaseline(Impl):
    archs = ("any",)

    def __init__(self, family: str, fns, call: Call, compiled: bool = False):
        self.family = family
        self.name = self.backend = "torch_compile" if compiled else "torch"
        self.needs_gpu = compiled  # inductor's CPU compile of large kernels is not worth timing
        self._fns, self._call, self._compiled = fns, call, compiled
        self._ready = None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        if self._ready is None:
            self._ready = _compile(self._fns) if self._compiled else self._fns
        return self._call(self._ready, case, inputs)


def register_torch_baselines(family: str, fns, call: Call, eager=None) -> None:
    """Register "torch" (eager; `eager` when a fused torch op beats the composition) and
    "torch_compile" (torch.compile of `fns`)."""
    register_impl(TorchBaseline(family, eager or fns, call))
    register_impl(TorchBaseline(family, fns, call, compiled=True))
