"""What the disk cache stores for a compiled kernel, and how it is brought back without the JIT.

A TVM-FFI compiled function is exported to one object file (`compiled.export_to_c`) and loaded with
`cute.runtime.load_module(..., enable_tvm_ffi=True)`. An impl may also return a plain object that
holds several compiled functions plus JSON-able values (mhc's pair of launches): each function is
exported on its own, and loading rebuilds an object of the same class with loaded functions in
their places and the values restored. Anything else cannot be stored (TypeError).
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path

OBJECT, CUBIN, PTX = "kernel.o", "kernel.cubin", "kernel.ptx"


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


def _split(compiled) -> tuple[dict[str, object], dict, str | None]:
    """(name -> exportable function, JSON-able state, "module:qualname" of a holder class or None)."""
    if hasattr(compiled, "export_to_c"):
        return {"": compiled}, {}, None
    attrs = {k: v for k, v in getattr(compiled, "__dict__", {}).items() if not k.startswith("__")}
    parts = {k: v for k, v in attrs.items() if hasattr(v, "export_to_c")}
    state = {k: v for k, v in attrs.items() if k not in parts}
    if not parts:
        raise TypeError(f"{type(compiled).__name__} is not a compiled function and holds none")
    json.dumps(state)  # TypeError when a value cannot be stored
    cls = type(compiled)
    return parts, state, f"{cls.__module__}:{cls.__qualname__}"


def export(compiled, function: str) -> tuple[dict[str, bytes], dict]:
    """(payloads by file name, the layout of the entry for `load`): an object file per compiled
    function (symbol `function`, suffixed by the part's name), and the cubin / PTX the compile kept."""
    parts, state, holder = _split(compiled)
    payloads, specs = {}, {}
    with tempfile.TemporaryDirectory(prefix="dsv4bench-export-") as tmp:
        for name, fn in parts.items():
            obj, symbol = (OBJECT, function) if not name else (f"kernel.{name}.o", f"{function}_{name}")
            fn.export_to_c(str(Path(tmp) / obj), function_name=symbol)
            payloads[obj] = (Path(tmp) / obj).read_bytes()
            specs[name] = {"object": obj, "function": symbol}
    for name, attr in ((CUBIN, "__cubin__"), (PTX, "__ptx__")):
        blob = artifact(compiled, attr)
        if blob:
            payloads[name] = blob
    return payloads, {"parts": specs, "state": state, "class": holder}


def load(paths: dict[str, Path], layout: dict):
    """The callable (or holder object) stored by `export`, from verified payload paths."""
    import cutlass.cute as cute

    cubin = paths[CUBIN].read_bytes() if CUBIN in paths else None
    loaded = {name: LoadedKernel(cute.runtime.load_module(str(paths[spec["object"]]), enable_tvm_ffi=True),
                                 spec["function"], cubin if not name else None)
              for name, spec in layout["parts"].items()}
    if layout["class"] is None:
        return loaded[""]
    module, qualname = layout["class"].split(":")
    cls = importlib.import_module(module)
    for attr in qualname.split("."):
        cls = getattr(cls, attr)
    holder = cls.__new__(cls)
    holder.__dict__.update(layout["state"], **loaded)
    holder.__cubin__ = cubin
    return holder
