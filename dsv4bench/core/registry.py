"""The Family / Impl registry: one place where every kernel family and implementation is known.

A Family owns the math (inputs, FP32 oracle, low-precision torch reference, cost model, case
space, its sweep options, the model ops it serves). An Impl is one way to compute it: our CuTeDSL
kernel, a declared knock-out variant of it, torch eager, torch.compile, or a peer library.

Families are discovered, not listed: every package `kernels/<name>/` holding a `family.py` is one
(the `kernels` package may span several directories on sys.path, see kernels/__init__.py), and
that module registers it at import. `load_families()` imports them, plus any module named in
DSV4BENCH_PLUGINS (comma-separated). docs/adding-a-family.md is the recipe.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from dsv4bench.core.case import Case
from dsv4bench.core.filters import apply_filters, grid_at_asked_values, parse_choice_list, parse_int_list

Tensors = dict  # name -> torch.Tensor

ARCHS = ("sm_90a", "sm_100a")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def family_packages() -> dict[str, str]:
    """Family name -> module of its registration (`kernels.<name>.family`), from the directories
    of the `kernels` package that hold a family.py. Found without importing any kernel."""
    import kernels

    found = {}
    for root in kernels.__path__:
        for pkg in sorted(Path(root).iterdir()):
            if (pkg / "family.py").is_file() and pkg.name.isidentifier():
                found.setdefault(pkg.name, f"kernels.{pkg.name}.family")
    return found


@dataclass(frozen=True)
class Option:
    """One shape filter of a family's sweep command: `--<name> a,b` keeps the cases whose parameter
    `param` is one of the values (with `extends`, a value the grid lacks first adds the grid at it). The
    family declares it once; `dsv4bench sweep <family> --help` shows `help`, `unit` and `choices` as
    written here."""

    param: str  # the case parameter it selects
    help: str  # in the family's own words
    unit: str = ""  # e.g. "elements", "tokens"
    choices: tuple = ()  # the allowed values (integers, or names when `names`); empty: any positive int
    names: bool = False  # values are names (bf16, causal), not integers
    flag: bool = False  # a --x/--no-x switch selecting True or False
    aliases: Mapping[str, str] = field(default_factory=dict)  # CLI name -> case value ("topk": "sparse")
    default: Any = None  # the value of a case without the parameter (one added after cases were recorded)
    # an asked value the grid lacks adds the grid's shapes at that value (origin "cli": `sweep gemm --rows 96`
    # times every layer at M 96); off, such a value selects nothing. Only for a parameter that any value of
    # suits every grid shape (a GEMM's M does; a head dim tied to a kernel's choices does not)
    extends: bool = False

    def describe(self) -> str:
        unit = f", in {self.unit}" if self.unit else ""
        shown = list(self.choices) + list(self.aliases)
        return f"{self.help}{unit}" + (f"; one or more of {', '.join(map(str, shown))}" if shown else "")

    def parse(self, name: str, raw: Any) -> list:
        """The typed values of `--name raw`; ValueError with one clear line on bad input."""
        if self.flag:
            key = str(raw).strip().lower()
            if key not in _TRUE + _FALSE:
                raise ValueError(f"--{name} takes true/false, got '{raw}'")
            return [key in _TRUE]
        if self.names:
            picked = parse_choice_list(name, raw, [*map(str, self.choices), *self.aliases])
            return [self.aliases.get(v, v) for v in picked]
        values = parse_int_list(name, raw)
        bad = [v for v in values if self.choices and v not in self.choices]
        if bad:
            raise ValueError(f"--{name} takes {', '.join(map(str, self.choices))}; got {bad[0]}")
        return values


@dataclass(frozen=True)
class Cost:
    """What one call must do at least: flops and the minimum bytes moved to and from DRAM."""

    flops: float
    bytes: float


@dataclass(frozen=True)
class Tolerance:
    """The docs/benchmarking.md rule. `exact` compares bit for bit (codes, scales, indices)."""

    ratio: float = 2.0  # max|out-oracle| <= ratio * max|lowprec-oracle| + atol_floor
    rel_l2: float = 1e-2  # ||out-oracle|| / ||oracle||
    exact: bool = False
    index_set: bool = False  # integer outputs compared as sets per row (top-k)
    # index sets chosen by scores the kernel computes itself: the oracle entry `scores` holds each row's
    # oracle scores, and a selected index may differ from the oracle's where both score within `near`
    # x the row's largest |lowprec - oracle| score error of the row's threshold (a near-tie)
    scores: str = ""
    near: float = 0.0
    aux: bool = False  # an oracle entry that is no output (read by another's comparison: `scores`)
    # values paired with an index_set output (a router's weights and ids): each row of output, oracle and reference is
    # put in the order of its own ids first, so another order of the same ids (torch.topk's among ties) still passes
    paired_with: str = ""


@dataclass
class SweepOptions:
    """What the user asked for on the command line; families read what applies to them."""

    examples: int = 20
    seed: int = 0
    grid: bool = True
    filters: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"hd": [64, 128]}


class Family(ABC):
    name: str = ""  # the name of its package under kernels/
    description: str = ""
    tolerance: Tolerance = Tolerance()
    space: Any = None  # its module in sweeps/: production() -> [params], extra(n, seed) -> [params]
    options: Mapping[str, Option] = {}  # its sweep command's shape filters, by option name
    # The model ops it serves (dsv4bench/model/dispatch.py): op name -> a callable with the op
    # oracle's signature (oracles/model.py ORACLE_OPS) that runs this family's kernel.
    serves: Mapping[str, Callable] = {}

    def cases(self, opts: SweepOptions) -> list[Case]:
        """The case space (sweeps/): the production grid, then hypothesis draws; filtered."""
        grid = [Case(self.name, p, opts.seed, "grid") for p in self.space.production()] if opts.grid else []
        drawn = [Case(self.name, p, opts.seed, "hypothesis") for p in self.space.extra(opts.examples, opts.seed)]
        asked = grid_at_asked_values(grid, opts.filters, self.options)
        return apply_filters(grid + asked + drawn, opts.filters, {k: o.param for k, o in self.options.items()},
                             {o.param: o.default for o in self.options.values()})

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

    def parse_filters(self, raw: Mapping[str, Any]) -> dict:
        """Turn CLI options (e.g. --hd 64,128) into typed filters; raise ValueError on bad input."""
        unknown = sorted(set(raw) - set(self.options))
        if unknown:
            takes = ", ".join(f"--{opt}" for opt in self.options) or "no shape options"
            raise ValueError(f"option --{unknown[0]} does not apply to {self.name} (it takes {takes})")
        return {opt: self.options[opt].parse(opt, v) for opt, v in raw.items()}


def import_reason(module: str) -> str | None:
    """None when a peer's module imports here, else one line saying why not (an Impl's `available`)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or a CUDA-only import failing on a CPU box
        return f"{module} not importable ({type(e).__name__}: {str(e)[:80]})"
    return None


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


def _import_family(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as e:  # a broken kernel module must not take the whole tool down
        BROKEN_MODULES[module] = f"{type(e).__name__}: {e}"


def load_families() -> None:
    """Import every family module; one that fails is recorded in BROKEN_MODULES, not fatal."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    extra = [m.strip() for m in os.environ.get("DSV4BENCH_PLUGINS", "").split(",") if m.strip()]
    for mod in list(family_packages().values()) + extra:
        _import_family(mod)
    for name, module in family_packages().items():
        if module not in BROKEN_MODULES and name not in _FAMILIES:
            BROKEN_MODULES[module] = f"it registered no family named '{name}' (a family is named after its package)"


def load_family(name: str) -> Family:
    """One family by name, importing only its own package (fast CLI paths); else as get_family."""
    module = family_packages().get(name)
    if module and name not in _FAMILIES and not _loaded:
        _import_family(module)
    return _FAMILIES[name] if name in _FAMILIES else get_family(name)


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


def impls(family: str, variants: bool = False) -> list[Impl]:
    """The family's impls; declared variants (knock-outs, ablations) only with `variants`."""
    if family not in _IMPLS:
        load_families()
    return [i for i in _IMPLS.get(family, []) if variants or not i.variant]


def broken_note(family: str) -> str:
    """'' or why part of the family's package failed to import: a module that raised after the family registered
    (a variants module imported last) leaves its impls unregistered, which reads as an unknown impl name."""
    module = family_packages().get(family)
    why = BROKEN_MODULES.get(module)
    return f"; the family loaded only in part: {module} ({why})" if why else ""


def get_impl(family: str, name: str) -> Impl:
    for impl in impls(family, variants=True):
        if impl.name == name:
            return impl
    known = ", ".join(i.name for i in impls(family, variants=True))
    raise KeyError(f"family '{family}' has no impl '{name}' (impls: {known}){broken_note(family)}")
