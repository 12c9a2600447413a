"""The Family / Impl registry: one place where every kernel family and implementation is known.

A Family owns the math (inputs, FP32 oracle, low-precision torch reference, cost model, case
space). An Impl is one way to compute it: our CuTeDSL kernel, torch eager, torch.compile, or a
peer library. Families register themselves at import time of their module; `load_families()`
imports the built-in ones plus any module named in DSV4BENCH_PLUGINS (comma-separated).
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dsv4bench.core.case import Case
from dsv4bench.core.filters import apply_filters, parse_choice_list, parse_int_list

Tensors = dict  # name -> torch.Tensor

ARCHS = ("sm_90a", "sm_100a")

# Modules that define the built-in families; each calls register_family at import.
BUILTIN_FAMILY_MODULES = [
    "kernels.rmsnorm.family",
    "kernels.rope.family",
    "kernels.mhc.family",
    "kernels.compressor.family",
    "kernels.quant.family",
    "kernels.router.family",
    "kernels.sampler.family",
    "kernels.fmha.family",
]


@dataclass(frozen=True)
class Cost:
    """What one call must do at least: flops and the minimum bytes moved to and from DRAM."""

    flops: float
    bytes: float


@dataclass(frozen=True)
class Tolerance:
    """The BENCHMARKING.md rule. `exact` compares bit for bit (codes, scales, indices)."""

    ratio: float = 2.0  # max|out-oracle| <= ratio * max|lowprec-oracle| + atol_floor
    rel_l2: float = 1e-2  # ||out-oracle|| / ||oracle||
    exact: bool = False
    index_set: bool = False  # integer outputs compared as sets per row (top-k)


@dataclass
class SweepOptions:
    """What the user asked for on the command line; families read what applies to them."""

    examples: int = 20
    seed: int = 0
    grid: bool = True
    filters: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"hd": [64, 128]}


class Family(ABC):
    name: str = ""
    description: str = ""
    tolerance: Tolerance = Tolerance()
    space: Any = None  # its module in sweeps/: production() -> [params], extra(n, seed) -> [params]
    filters: Mapping[str, str] = {}  # CLI shape option -> the case param it selects, e.g. {"width": "n"}
    choices: Mapping[str, Sequence[str]] = {}  # options taking names (--dtype bf16), not integers

    def cases(self, opts: SweepOptions) -> list[Case]:
        """The case space (sweeps/): the production grid, then hypothesis draws; filtered."""
        params = [(p, "grid") for p in self.space.production()] if opts.grid else []
        params += [(p, "hypothesis") for p in self.space.extra(opts.examples, opts.seed)]
        cases = [Case(self.name, p, opts.seed, origin) for p, origin in params]
        return apply_filters(cases, opts.filters, self.filters)

    @abstractmethod
    def make_inputs(self, case: Case, gen: "Any", device: str) -> Tensors:
        """Fresh random inputs (never zeros or constants) from a seeded torch.Generator."""

    @abstractmethod
    def oracle(self, case: Case, inputs: Tensors) -> Tensors:
        """FP32 (or FP64) truth."""

    @abstractmethod
    def lowprec(self, case: Case, inputs: Tensors) -> Tensors:
        """The same math composed in torch in the kernel's dtype."""

    @abstractmethod
    def alloc_outputs(self, case: Case, device: str) -> Tensors:
        """Output buffers for impls that write in place; the harness poisons them with NaN."""

    @abstractmethod
    def cost(self, case: Case) -> Cost: ...

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        return self.tolerance

    def parse_filters(self, raw: Mapping[str, str]) -> dict:
        """Turn CLI options (e.g. --hd 64,128) into typed filters; raise ValueError on bad input."""
        unknown = sorted(set(raw) - set(self.filters))
        if unknown:
            takes = ", ".join(f"--{opt} ({param})" for opt, param in self.filters.items()) or "no shape options"
            raise ValueError(f"option --{unknown[0]} does not apply to {self.name} (it takes {takes})")
        return {opt: parse_choice_list(opt, v, list(self.choices[opt])) if opt in self.choices
                else parse_int_list(opt, v) for opt, v in raw.items()}


class Unsupported(Exception):
    """Raised by an impl's `run` when its backend declines the case only at call time (a peer's own
    dispatch: cuDNN's "No available kernel"): the result is UNSUPPORTED with this message, not
    FAIL_RUNTIME. Rules known in advance belong in `supports`."""


class Impl(ABC):
    family: str = ""
    name: str = ""
    backend: str = ""  # cutedsl | torch | torch_compile | quack | flashmla | fa4 | cudnn
    archs: tuple = ARCHS  # archs it compiles for (cutedsl) or runs on (peers: any)
    needs_gpu: bool = True
    compiles: bool = False  # has a CuTeDSL compile step that works on a CPU with fake tensors
    # A declared variant of another impl (a knock-out or an ablation, next to the kernel it probes):
    # named "<base>:<variant>" (e.g. "cutedsl:no-softmax"), run only when `--impl` names it.
    variant: str = ""
    # False for a knock-out whose output is meaningless: it is run and timed but never compared
    # (status UNCHECKED). A variant that computes the real answer keeps True and must pass.
    checked: bool = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        """None when supported, else a short reason (-> status UNSUPPORTED)."""
        return None

    def available(self) -> str | None:
        """None when the backend's library imports here, else why not."""
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        """Everything that changes the compiled code (not runtime sizes)."""
        return (self.family, self.name, arch)

    def compile(self, case: Case, arch: str) -> "Any":
        """Compile with fake tensors (no GPU needed); returns a compiled artifact."""
        raise NotImplementedError

    @abstractmethod
    def run(self, case: Case, inputs: Tensors, out: Tensors, compiled: "Any") -> Tensors:
        """Compute; write into `out` where the impl writes in place, return the outputs."""


_FAMILIES: dict[str, Family] = {}
_IMPLS: dict[str, list[Impl]] = {}


def register_family(family: Family) -> Family:
    _FAMILIES[family.name] = family
    _IMPLS.setdefault(family.name, [])
    return family


def register_impl(impl: Impl) -> Impl:
    _IMPLS.setdefault(impl.family, [])
    if all(i.name != impl.name for i in _IMPLS[impl.family]):
        _IMPLS[impl.family].append(impl)
    return impl


_loaded = False
BROKEN_MODULES: dict[str, str] = {}  # module -> why it failed to import (shown by `list`)


def load_families() -> None:
    """Import every family module; one that fails is recorded in BROKEN_MODULES, not fatal."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    extra = [m.strip() for m in os.environ.get("DSV4BENCH_PLUGINS", "").split(",") if m.strip()]
    for mod in BUILTIN_FAMILY_MODULES + extra:
        try:
            importlib.import_module(mod)
        except Exception as e:  # a broken kernel module must not take the whole tool down
            BROKEN_MODULES[mod] = f"{type(e).__name__}: {e}"


def families() -> dict[str, Family]:
    load_families()
    return dict(_FAMILIES)


def get_family(name: str) -> Family:
    load_families()
    if name not in _FAMILIES:
        known = ", ".join(sorted(_FAMILIES))
        broken = [f"{m} ({why})" for m, why in BROKEN_MODULES.items() if name in m]
        if broken:
            raise KeyError(f"kernel family '{name}' failed to load: {broken[0]}")
        raise KeyError(f"unknown kernel family '{name}' (known: {known})")
    return _FAMILIES[name]


def impls(family: str) -> list[Impl]:
    load_families()
    return list(_IMPLS.get(family, []))


def get_impl(family: str, name: str) -> Impl:
    for impl in impls(family):
        if impl.name == name:
            return impl
    raise KeyError(f"family '{family}' has no impl '{name}'")
