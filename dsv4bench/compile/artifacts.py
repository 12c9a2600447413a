"""What the disk cache stores for a compiled kernel, and how it is brought back without the JIT.

A TVM-FFI compiled function is exported to one object file (`compiled.export_to_c`) and loaded with
`cute.runtime.load_module(..., enable_tvm_ffi=True)`. Anything else cannot be stored (TypeError): a
kernel of several launches is one jitted function that launches them (kernels/mhc/family.py,
`HcTwoPass`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

OBJECT, CUBIN, PTX = "kernel.o", "kernel.cubin", "kernel.ptx"


def compiled_functions(compiled) -> list:
    """The compiled functions a compile holds: itself, or each of a dispatcher's between several
    compiles (an object whose `kernels` maps names to them: kernels/indexer/topk_glue.py CompiledTopk)."""
    kernels = getattr(compiled, "kernels", None)
    return list(kernels.values()) if isinstance(kernels, dict) else [compiled]


def artifact(compiled, attr: str = "__cubin__") -> bytes | None:
    """A kept artifact of a compiled function (__cubin__, __ptx__): its bytes, whether the attribute
    holds them, the text, or the path of the file dumped with --dump-dir."""
    value = getattr(compiled, attr, None)
    if isinstance(value, str):
        if "\n" in value:  # PTX text
            return value.encode()
        return Path(value).read_bytes() if Path(value).is_file() else None
    return bytes(value) if value else None


class LoadedKernel:
    """A kernel loaded from its exported object: called like the compiled one, positionally."""

    def __init__(self, module, function: str, cubin: bytes | None):
        self.module = module  # keeps the loaded object alive as long as the function
        self.function = getattr(module, function)
        self.__cubin__ = cubin

    def __call__(self, *args):
        return self.function(*args)


def export(compiled, function: str) -> tuple[dict[str, bytes], dict]:
    """(payloads by file name, the layout of the entry for `load`): the object file of the compiled
    function (symbol `function`) and the cubin / PTX the compile kept. TypeError for anything that is
    not a TVM-FFI compiled function (it is cached in memory only)."""
    if not hasattr(compiled, "export_to_c"):
        raise TypeError(f"{type(compiled).__name__} is not a compiled function")
    payloads = {}
    with tempfile.TemporaryDirectory(prefix="dsv4bench-export-") as tmp:
        compiled.export_to_c(str(Path(tmp) / OBJECT), function_name=function)
        payloads[OBJECT] = (Path(tmp) / OBJECT).read_bytes()
    for name, attr in ((CUBIN, "__cubin__"), (PTX, "__ptx__")):
        blob = artifact(compiled, attr)
        if blob:
            payloads[name] = blob
    return payloads, {"object": OBJECT, "function": function}


def load(paths: dict[str, Path], layout: dict) -> LoadedKernel:
    """The function stored by `export`, from verified payload paths."""
    import cutlass.cute as cute

    cubin = paths[CUBIN].read_bytes() if CUBIN in paths else None
    module = cute.runtime.load_module(str(paths[layout["object"]]), enable_tvm_ffi=True)
    return LoadedKernel(module, layout["function"], cubin)
