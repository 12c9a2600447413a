"""Reference rows shared by the families' declared variants (kernels/<family>/variants.py).

`EmptyGridMixin` turns an impl into `cutedsl:empty-grid`: a kernel of the shipped kernel's grid and
block size that does nothing, i.e. the launch floor of that shape (no loads, no stores; its output
is meaningless, so the variant declares `checked = False`). The grid is a run-time argument, so one
compiled empty kernel per block size serves every case. A family declares it as

    class QuantEmptyGrid(EmptyGridMixin, QuantCuteDSL):
        name, variant, checked = "cutedsl:empty-grid", "empty-grid", False
        def launch_shape(self, case): return (grid_x, grid_y, grid_z), threads

Imports nothing from the harness (kernels never do).
"""

from __future__ import annotations

import cutlass.cute as cute
import torch
from cutlass import Int32

from kernels.common import compile_kernel, fake_rowmajor

EMPTY_GRID = "empty-grid"


class EmptyKernel:
    """grid (run time) x `threads` (compile time) threads that do nothing. The tensor argument only
    carries the device, whose current stream (TVM-FFI's environment stream) the launch goes to."""

    def __init__(self, threads: int):
        self.threads = threads

    @cute.jit
    def __call__(self, mT: cute.Tensor, gx: Int32, gy: Int32, gz: Int32, stream):
        self.kernel().launch(grid=[gx, gy, gz], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self):
        pass


def compile_empty(threads: int, arch: str):
    return compile_kernel(EmptyKernel(threads), fake_rowmajor("fp32", (cute.sym_int(),), 4),
                          Int32(1), Int32(1), Int32(1), arch=arch)


_ANCHORS: dict = {}


def _anchor(device) -> torch.Tensor:
    """A one-element fp32 tensor on `device`, kept across calls (no allocation in a timed call)."""
    key = str(device)
    if key not in _ANCHORS:
        _ANCHORS[key] = torch.empty(1, dtype=torch.float32, device=device)
    return _ANCHORS[key]


class EmptyGridMixin:
    """Mixed in before a family's CuTeDSL impl: compile / run the empty kernel of that impl's launch
    shape. `launch_shape(case)` -> ((grid x, y, z), threads per CTA) of the shipped kernel."""

    def launch_shape(self, case) -> tuple[tuple[int, int, int], int]:
        raise NotImplementedError

    def compile_key(self, case, arch: str) -> tuple:
        return (self.family, self.name, arch, self.launch_shape(case)[1])

    def compile(self, case, arch: str):
        return compile_empty(self.launch_shape(case)[1], arch)

    def run(self, case, inputs: dict, out: dict, compiled) -> dict:
        (gx, gy, gz), _ = self.launch_shape(case)
        device = next(iter(out.values())).device
        compiled(_anchor(device), gx, gy, gz)
        return out
