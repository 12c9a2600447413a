"""Glue shared by the CuTeDSL families: dtype names, fake tensors, the compile call, the SM count of
a persistent launch and the peers' cache of derived operands."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

CUTE_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class CompilePolicy:
    """What the harness wants kept from a compile; it sets this (kernels never import the harness).
    keep_ptx(arch): keep the PTX too (the harness's ptxas lint reads it). dump_dir: where the kept
    cubin/PTX files go (default: a per-process temporary directory, removed at exit)."""

    keep_ptx: Callable[[str], bool] = lambda arch: False
    dump_dir: str | None = None

    def dump(self) -> str:
        if self.dump_dir is None:
            self.dump_dir = tempfile.mkdtemp(prefix="dsv4-cute-")
            atexit.register(shutil.rmtree, self.dump_dir, True)
        return self.dump_dir


POLICY = CompilePolicy()


def fake_rowmajor(dtype_name: str, shape: tuple, align: int = 16):
    """A fake row-major tensor; use cute.sym_int() entries for runtime sizes."""
    order = tuple(range(len(shape) - 1, -1, -1))
    return make_fake_compact_tensor(CUTE_DTYPES[dtype_name], shape, stride_order=order, assumed_align=align)


def compile_kernel(kernel, *fake_args, arch: str):
    """Compile a @cute.jit callable for `arch` with the TVM-FFI calling convention.

    Works without a GPU. The result is called with torch tensors on the current CUDA stream;
    --keep-cubin keeps the cubin for resource reports and the on-disk cache; --keep-ptx (sm_90a /
    sm_100a, when the harness's POLICY asks) the PTX for its `wgmma-serialized` lint.
    """
    # --keep-cubin also writes the cubin to a dump dir (default: the cwd); keep it out of trees
    ptx = " --keep-ptx" if POLICY.keep_ptx(arch) else ""
    return cute.compile(
        kernel, *fake_args, make_fake_stream(use_tvm_ffi_env_stream=True),
        options=f"--gpu-arch {arch} --enable-tvm-ffi --keep-cubin{ptx} --dump-dir={POLICY.dump()}",
    )


def argument_check(op: str) -> Callable[[bool, str, str], None]:
    """`need(ok, name, what)`: raise ValueError("{op}: {name} {what}") unless ok (the glues' input checks:
    one clear error naming the argument, never a wrong answer)."""
    def need(ok: bool, name: str, what: str) -> None:
        if not ok:
            raise ValueError(f"{op}: {name} {what}")
    return need


@functools.cache
def sm_count(device) -> int:
    """CTAs of a persistent launch: one per SM."""
    return torch.cuda.get_device_properties(device).multi_processor_count


class Prepared:
    """Derived values cached per source tensors (an operand layout or dtype a peer's API needs that a
    model would make once; a weight's padded scales): remade when a source is another object (weak
    references, so a new tensor at a freed one's address is not mistaken for it) or was written to.
    Holds the last `size` sources' values; a value goes as soon as a source is freed (the weak reference's
    callback: a sweep's next case would otherwise hold both cases' derived weights, 10-25 GB a Pro layer)."""

    def __init__(self, size: int = 1):
        self.size, self._entries = size, {}

    def get(self, sources: tuple, make):
        key = tuple(id(t) for t in sources)
        hit = self._entries.get(key)
        versions = tuple(t._version for t in sources)
        if hit is None or any(r() is not t for r, t in zip(hit[0], sources)) or hit[1] != versions:
            if len(self._entries) >= self.size:
                self._entries.pop(next(iter(self._entries)))
            cache = weakref.ref(self)

            def forget(dead, key=key):  # one of this entry's sources was freed (not a later entry's at its key)
                owner = cache()
                entry = owner._entries.get(key) if owner is not None else None
                if entry is not None and dead in entry[0]:
                    del owner._entries[key]

            hit = self._entries[key] = (tuple(weakref.ref(t, forget) for t in sources), versions, make())
        return hit[2]
