"""What the disk cache stores for a compiled kernel, and how it is brought back without the JIT.

A TVM-FFI compiled function is exported to one object file (`compiled.export_to_c`) and loaded with
`cute.runtime.load_module(..., enable_tvm_ffi=True)`. A bundle of several compiles (an object whose
`kernels` maps names to compiled functions: kernels/moe/layer.py CompiledLayer, kernels/indexer/
select_glue.py CompiledSelect, ...) is stored as each function's files under a numbered prefix plus the
bundle itself pickled with its functions as references by name (`bundle.pkl`), so that fields beside the
functions (flags, configs, nested bundles) come back as they were. The pickle is only ever read from an
entry the store has verified as written by this user (compile/store.py: HMAC with the user's key).
Anything else cannot be stored (TypeError).
"""

from __future__ import annotations

import io
import pickle
import tempfile
from pathlib import Path

OBJECT, CUBIN, PTX = "kernel.o", "kernel.cubin", "kernel.ptx"
BUNDLE = "bundle.pkl"


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
    function (symbol `function`) and the cubin / PTX the compile kept; for a bundle, those of each of
    its functions (symbols `function`_i) and the pickled bundle. TypeError for anything else (it is
    cached in memory only)."""
    kernels = getattr(compiled, "kernels", None)
    if isinstance(kernels, dict):
        return _export_bundle(compiled, kernels, function)
    return _export_function(compiled, function, "")


def _export_function(compiled, function: str, prefix: str) -> tuple[dict[str, bytes], dict]:
    if not hasattr(compiled, "export_to_c"):
        raise TypeError(f"{type(compiled).__name__} is not a compiled function")
    payloads = {}
    with tempfile.TemporaryDirectory(prefix="dsv4bench-export-") as tmp:
        compiled.export_to_c(str(Path(tmp) / OBJECT), function_name=function)
        payloads[prefix + OBJECT] = (Path(tmp) / OBJECT).read_bytes()
    for name, attr in ((CUBIN, "__cubin__"), (PTX, "__ptx__")):
        blob = artifact(compiled, attr)
        if blob:
            payloads[prefix + name] = blob
    return payloads, {"object": prefix + OBJECT, "function": function,
                      "cubin": prefix + CUBIN if prefix + CUBIN in payloads else None}


class _BundlePickler(pickle.Pickler):
    """Pickles a bundle with each of its compiled functions replaced by its name."""

    def __init__(self, file, names: dict[int, str]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.names = names

    def persistent_id(self, obj):
        return self.names.get(id(obj))


class _BundleUnpickler(pickle.Unpickler):
    def __init__(self, file, loaded: dict):
        super().__init__(file)
        self.loaded = loaded

    def persistent_load(self, pid):
        return self.loaded[pid]


def _export_bundle(bundle, kernels: dict, function: str) -> tuple[dict[str, bytes], dict]:
    payloads, parts = {}, {}
    for i, (name, fn) in enumerate(kernels.items()):
        files, parts[name] = _export_function(fn, f"{function}_{i}", f"{i}-")
        payloads.update(files)
    buf = io.BytesIO()
    _BundlePickler(buf, {id(fn): name for name, fn in kernels.items()}).dump(bundle)
    payloads[BUNDLE] = buf.getvalue()
    return payloads, {"bundle": BUNDLE, "parts": parts}


def load(paths: dict[str, Path], layout: dict):
    """The function (or bundle) stored by `export`, from verified payload paths."""
    if "bundle" in layout:
        loaded = {name: _load_function(paths, part) for name, part in layout["parts"].items()}
        return _BundleUnpickler(io.BytesIO(paths[layout["bundle"]].read_bytes()), loaded).load()
    return _load_function(paths, layout)


def _load_function(paths: dict[str, Path], layout: dict) -> LoadedKernel:
    import cutlass.cute as cute

    cubin_name = layout.get("cubin", CUBIN)  # entries written before bundles name no cubin: kernel.cubin
    cubin = paths[cubin_name].read_bytes() if cubin_name in paths else None
    module = cute.runtime.load_module(str(paths[layout["object"]]), enable_tvm_ffi=True)
    return LoadedKernel(module, layout["function"], cubin)
