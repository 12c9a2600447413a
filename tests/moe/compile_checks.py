"""The sm_90a compile check of one grouped-GEMM configuration, shared by the v2 and v3 CPU tests
(tests/moe/test_grouped_cpu.py, tests/moe/test_grouped_v3_cpu.py)."""

from __future__ import annotations

from dsv4bench.compile import ptxas
from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from kernels.common import POLICY
from kernels.moe.layer import compile_grouped


def compile_checked(layout: str, epilogue: str, knobs: dict, monkeypatch, n: int = 512, k: int = 256,
                    local_bytes: int = 0):
    """compile_grouped (N = 512, K = 256 unless given, `knobs`) with its PTX kept: an sm_90 cubin, no local memory at
    decode (masked: one 64-row wave, nothing spilled; `local_bytes` where a known spill is allowed) and, where this
    machine has ptxas, PTX that assembles with no serialised wgmma. Returns the compile."""
    monkeypatch.setattr(POLICY, "keep_ptx", lambda arch: True)
    compiled = compile_grouped(layout, epilogue, n, k, **knobs)
    info = parse_cubin(artifact(compiled))
    assert info.sm == 90
    if layout == "masked":
        assert info.local_bytes == local_bytes
    exe = ptxas.find_ptxas()
    if exe is not None:
        rc, log = ptxas.run_ptxas(exe, artifact(compiled, "__ptx__"), "sm_90a")
        serialized, _ = ptxas.parse(log)
        assert rc == 0 and serialized == []
    return compiled
