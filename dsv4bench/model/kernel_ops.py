"""Model ops served by kernel families: the bridge between the model's op vocabulary
(oracles/model.py ORACLE_OPS) and the family registry.

A family declares `serves = {"op": adapter}`; an adapter has the op oracle's signature with one
leading argument, `run(params, inputs) -> outputs`, which runs the family's CuTeDSL impl on the case
`params` with `inputs` (tensors in the kernel's dtypes, on the model's device). `run` compiles once
per compile key (the compile cache) and raises `Unsupported` for a shape the kernel does not take,
or for inputs that are not on a CUDA device (a model run on the CPU). An adapter that drives the impl's
compiled pieces itself (kernels/moe/serves.py: the routed layer with its load-time weights, made once
per weight) asks `run.compiled(params, inputs)` for the compiled object, after the same checks.
"""

from __future__ import annotations

import functools
from typing import Callable

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Family, Unsupported, families, get_impl

KERNEL = "cutedsl"  # the backend name kernel-served ops register under


def device_arch() -> str | None:
    """The current CUDA device's arch (sm_90a on an H100), None without one; read once per device."""
    import torch

    if not torch.cuda.is_available():
        return None
    return _arch_of(torch.cuda.current_device())


@functools.cache
def _arch_of(device: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


class KernelOp:
    """One op served by one family's CuTeDSL impl."""

    def __init__(self, family: Family, op: str, adapter: Callable, impl: str = KERNEL):
        self.family, self.op, self.adapter = family, op, adapter
        self.impl = get_impl(family.name, impl)
        self._cache = None
        self._taken: dict = {}  # (params, arch) -> (case, compiled): the checks and lookups done once
        self.runner = Runner(self)

    def compile(self, params: dict, inputs: dict) -> tuple[Case, object]:
        """(case, compiled) of `params`, after the checks: a CUDA GPU, CUDA inputs, a shape the impl takes.
        A params dict seen before skips the case, `supports` and the compile cache (~25 µs of host time
        a call on the CPU, against kernels of a few µs at decode)."""
        arch = device_arch()
        if arch is None:
            raise Unsupported(f"{self.op}: the {self.family.name} kernel needs a CUDA GPU")
        off = sorted({str(t.device) for t in inputs.values() if t.device.type != "cuda"})
        if off:
            raise Unsupported(f"{self.op}: the {self.family.name} kernel takes CUDA tensors, got {', '.join(off)}")
        key = _params_key(params, arch)
        if key in self._taken:
            return self._taken[key]
        case = Case(self.family.name, params)
        reason = self.impl.supports(case, arch)
        if reason:
            raise Unsupported(f"{self.op}: the {self.family.name} kernel does not take {case.shape_str()}: {reason}")
        if self._cache is None:
            from dsv4bench.compile.cache import CompileCache

            self._cache = CompileCache()
        taken = case, self._cache.get(self.impl, case, arch)[0]
        if key is not None:
            self._taken[key] = taken
        return taken

    def run(self, params: dict, inputs: dict) -> dict:
        case, compiled = self.compile(params, inputs)
        out = self.family.alloc_outputs(case, "cuda")
        return self.impl.run(case, inputs, out, compiled)

    def __call__(self, *args, **kwargs):
        return self.adapter(self.runner, *args, **kwargs)

    def describe(self) -> str:
        return f"{self.family.name}/{self.impl.name} ({', '.join(self.impl.archs)})"


def _params_key(params: dict, arch: str):
    """A hashable key of a case's params (lists as tuples), or None where a value is not hashable."""
    try:
        key = (arch,) + tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))
        hash(key)
        return key
    except TypeError:
        return None


class Runner:
    """What an adapter gets as `run`: `run(params, inputs) -> outputs` (the impl run on the case), and
    `run.compiled(params, inputs)`, the compiled object alone (compiled once per compile key)."""

    def __init__(self, op: KernelOp):
        self.op = op

    def __call__(self, params: dict, inputs: dict) -> dict:
        return self.op.run(params, inputs)

    def compiled(self, params: dict, inputs: dict):
        return self.op.compile(params, inputs)[1]


def served_ops() -> dict[str, KernelOp]:
    """Every op a registered family serves, op -> KernelOp (the first family to claim it)."""
    out: dict[str, KernelOp] = {}
    for name, family in sorted(families().items()):
        for op, adapter in family.serves.items():
            out.setdefault(op, KernelOp(family, op, adapter))
    return out
