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


# A sweep compiles one function for many shapes (dynamic=False: one specialised kernel each).
# Past dynamo's default recompile limit (8 per code object) it silently runs the function
# *eagerly and unfused* from then on, and "torch_compile" timed 11x slower than eager
# (rmsnorm v3 on the H100, docs/perf/rmsnorm.md). The limits are raised for every compile we make.
RECOMPILE_LIMIT = 4096


def _compile(fns, backend: str = "inductor"):
    import torch._dynamo.config as dynamo_config

    # the names moved across torch versions (cache_size_limit -> recompile_limit)
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
    if isinstance(fns, Mapping):
        return {name: torch.compile(fn, dynamic=False, backend=backend) for name, fn in fns.items()}
    return torch.compile(fns, dynamic=False, backend=backend)


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
