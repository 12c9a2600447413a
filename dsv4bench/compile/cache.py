"""Compiled-kernel cache used by the worker: one compile per compile key per process.

Returns the compiled function plus a CompileInfo (compile seconds, cubin resources, and where it
came from: "miss" = compiled now, "memory" = reused in this process).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dsv4bench.compile.cubin import parse_cubin


@dataclass
class CompileInfo:
    seconds: float
    cache: str  # miss | memory
    cubin_bytes: int | None = None
    registers: int | None = None
    local_bytes: int | None = None
    static_smem_bytes: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


def cubin_bytes(compiled) -> bytes | None:
    """The cubin of a compiled function: bytes, or the path of the dumped file (--dump-dir)."""
    cubin = getattr(compiled, "__cubin__", None)
    if isinstance(cubin, str):
        return Path(cubin).read_bytes() if Path(cubin).is_file() else None
    return cubin or None


def describe(compiled, seconds: float, cache: str) -> CompileInfo:
    cubin = cubin_bytes(compiled)
    if not cubin:
        return CompileInfo(seconds, cache)
    info = parse_cubin(cubin)
    return CompileInfo(seconds, cache, info.cubin_bytes, info.registers, info.local_bytes, info.static_smem_bytes)


class CompileCache:
    def __init__(self):
        self._mem: dict[tuple, tuple[object, CompileInfo]] = {}

    def get(self, impl, case, arch: str) -> tuple[object, CompileInfo]:
        key = impl.compile_key(case, arch)
        if key in self._mem:
            compiled, info = self._mem[key]
            return compiled, CompileInfo(0.0, "memory", info.cubin_bytes, info.registers, info.local_bytes,
                                         info.static_smem_bytes)
        t0 = time.perf_counter()
        compiled = impl.compile(case, arch)
        info = describe(compiled, time.perf_counter() - t0, "miss")
        self._mem[key] = (compiled, info)
        return compiled, info
