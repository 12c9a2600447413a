"""Router, quant and sampler: each CuTeDSL source compiles for sm_90a and sm_100a on a machine
without a GPU (fake tensors), cold, with no local memory, and the cubin is built for that arch."""

from __future__ import annotations

import struct

import pytest

from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from sweeps import quant as qspace
from sweeps import router as rspace
from sweeps import sampler as sspace

CASES = {
    "fp8-7168": Case("quant", qspace.fp8(64, 7168)),
    "fp8-16384": Case("quant", qspace.fp8(64, 16384)),
    "fp8-kv-448": Case("quant", qspace.fp8(64, 448, 64, 512)),
    "mxfp4-rot-128": Case("quant", qspace.mxfp4(64)),
    "mxfp4-96": Case("quant", qspace.mxfp4(3, 96, rotate=False)),
    "router-256-bias": Case("router", rspace.case(64, 256, 1.5, False)),
    "router-384-hash": Case("router", rspace.case(64, 384, 2.5, True)),
    "router-100-top3": Case("router", rspace.case(5, 100, 1.0, False, k=3)),
    "sampler-129280": Case("sampler", sspace.case(64, 0.6)),
    "sampler-1028": Case("sampler", sspace.case(3, 1.0, 1028)),
}
ARCH_SM = {"sm_90a": 90, "sm_100a": 100}


def elf_sm(cubin: bytes) -> int:
    """The SM a cubin targets, from its ELF flags: bits 0-7 up to ELF ABI v7 (sm_90a), bits 8-15 from
    ABI v8 on (sm_100a). dsv4bench.compile.cubin reads only the old place (reports 10 for sm_100a)."""
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


@pytest.mark.parametrize("arch", sorted(ARCH_SM))
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_without_gpu(name, arch):
    case = CASES[name]
    impl = get_impl(case.family, "cutedsl")
    assert impl.supports(case, arch) is None
    cubin = impl.compile(case, arch).__cubin__  # always a cold compile
    info = parse_cubin(cubin)
    assert info.cubin_bytes > 1000 and elf_sm(cubin) == ARCH_SM[arch]
    assert 0 < info.registers <= 128 and info.local_bytes == 0  # no spills, no stack arrays
