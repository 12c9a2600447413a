"""Generic conformance of every registered family (discovered from kernels/<name>/family.py), so a
new family is checked the day it lands, with nothing to add here:

- its declaration is complete (description, sweep options that select cases, a case space);
- on the CPU, the low-precision reference passes the tolerance rule against the FP32 oracle, and a
  wrong answer fails it (the check can fail);
- each CuTeDSL impl compiles for each arch it declares from fake tensors (no GPU), cubin for that
  arch, no local memory (spills) on sm_90a;
- on a GPU (marked `gpu`), each CuTeDSL impl against the oracle on every production case plus
  hypothesis draws, through the one evaluation path (the `gpu_check` fixture).

A family's own tests (tests/<family>/) cover what is particular to it.
"""

from __future__ import annotations

import struct

import pytest
import torch

from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.compile.artifacts import artifact, compiled_functions
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import SweepOptions, families, impls

FAMILIES = sorted(families())
CPU_CHECK_BYTES = 8 << 20  # the FP32 oracle of a case moving more than this is left to the GPU run
CPU_CASES = 4  # per family
COMPILE_KEYS = 3  # distinct compiled kernels per family and arch (spread over the production grid)
GPU_DRAWS, GPU_SEED = 20, 9
ARCH_SM = {"sm_90a": 90, "sm_100a": 100}


def _spread(items: list, n: int) -> list:
    """`n` items evenly spaced over the list (all of them when it is short)."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


def _cpu_cases() -> list:
    out = []
    for name in FAMILIES:
        fam = families()[name]
        small = [c for c in fam.cases(SweepOptions(examples=4, seed=3)) if fam.cost(c).bytes <= CPU_CHECK_BYTES]
        out += _spread(small, CPU_CASES)
    return out


def _compile_cases() -> list:
    """(impl, arch, case): per CuTeDSL impl and declared arch, cases of distinct compile keys."""
    out = []
    for name in FAMILIES:
        cases = families()[name].cases(SweepOptions(examples=0))
        for impl in impls(name):
            if not impl.compiles:
                continue
            for arch in impl.archs:
                by_key = {}
                for c in cases:
                    if impl.supports(c, arch) is None:
                        by_key.setdefault(impl.compile_key(c, arch), c)
                out += [(impl, arch, c) for c in _spread(list(by_key.values()), COMPILE_KEYS)]
    return out


def _gpu_cases() -> list:
    return [(impl, c) for name in FAMILIES
            for c in families()[name].cases(SweepOptions(examples=GPU_DRAWS, seed=GPU_SEED))
            for impl in impls(name) if impl.compiles]


CPU_CASES_ALL, COMPILE_CASES, GPU_CASES = _cpu_cases(), _compile_cases(), _gpu_cases()


@pytest.mark.parametrize("name", FAMILIES)
def test_declaration_is_complete(name):
    fam = families()[name]
    assert fam.name == name and fam.description, "a family has its package's name and a description"
    grid = fam.cases(SweepOptions(examples=0))
    assert grid, "the production grid is empty"
    drawn = fam.cases(SweepOptions(examples=3, seed=1, grid=False))
    assert drawn == fam.cases(SweepOptions(examples=3, seed=1, grid=False)), "draws must be deterministic per seed"
    assert any(i.compiles for i in impls(name)), "no CuTeDSL impl"
    for opt_name, opt in fam.options.items():
        assert opt.help, f"--{opt_name} has no help"
        assert any(opt.param in c.params for c in grid), f"--{opt_name} selects parameter {opt.param!r}, " \
                                                          "which no production case has"
    for impl in impls(name, variants=True):
        assert impl.family == name
        assert (":" in impl.name) == bool(impl.variant), f"{impl.name}: a variant is named '<base>:<variant>'"


@pytest.mark.parametrize("case", CPU_CASES_ALL, ids=[c.id for c in CPU_CASES_ALL])
def test_lowprec_passes_and_a_wrong_answer_fails_on_cpu(case):
    fam = families()[case.family]
    data = CaseData(fam, case, "cpu")
    tol = lambda n: fam.tolerance_for(case, n)  # noqa: E731
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, tol)
    assert ok, {k: m.summary() for k, m in metrics.items()}
    name, ref = next((k, v) for k, v in data.lowprec.items() if k in data.oracle and v.numel())
    wrong = {k: v.clone() for k, v in data.lowprec.items()}
    flat = wrong[name].view(-1)
    mid = flat.numel() // 2
    if flat.dtype.is_floating_point:  # one element off by far more than any rounding, at the middle
        finite = torch.isfinite(data.oracle[name].reshape(-1))  # or the next element not masked (-inf)
        at = (mid + int(torch.nonzero(finite.roll(-mid))[0])) % flat.numel() if finite.any() else mid
        top = float(data.oracle[name].reshape(-1)[finite].abs().max()) if finite.any() else 0.0
        flat[at] += 1.0 + 4 * top
    else:
        flat[mid] += 1
    assert not compare_outputs(wrong, data.oracle, data.lowprec, tol)[0], "a wrong answer passed the rule"


def elf_sm(cubin: bytes) -> int:
    """The SM a cubin targets, from its ELF flags: bits 0-7 up to ELF ABI v7 (sm_90a), bits 8-15 from
    ABI v8 on (sm_100a)."""
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


@pytest.mark.parametrize("impl, arch, case", COMPILE_CASES,
                         ids=[f"{c.family}-{i.name}-{a}-{c.id}" for i, a, c in COMPILE_CASES])
def test_compiles_from_fake_tensors(impl, arch, case):
    print(case, impl.name, arch)
    for fn in compiled_functions(impl.compile(case, arch)):  # cold: no cache
        cubin = artifact(fn)
        assert cubin, "no cubin kept"
        info = parse_cubin(cubin)
        print(f"{info.registers} registers, {info.local_bytes} B local, {info.cubin_bytes} B cubin")
        assert info.cubin_bytes > 1000 and elf_sm(cubin) == ARCH_SM[arch]
        assert 0 < info.registers <= 255
        if arch == "sm_90a":
            assert info.local_bytes == 0, f"{info.local_bytes} B of local memory (spills)"


@pytest.mark.gpu
@pytest.mark.parametrize("impl, case", GPU_CASES, ids=[f"{c.family}-{i.name}-{c.id}" for i, c in GPU_CASES])
def test_matches_oracle_on_gpu(impl, case, gpu_check):
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    if arch not in impl.archs:
        pytest.skip(f"{impl.name} is built for {', '.join(impl.archs)}, not {arch}")
    if impl.supports(case, arch):
        pytest.skip(impl.supports(case, arch))
    gpu_check(case, impl)

