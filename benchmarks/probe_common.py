"""What the knock-out probes (benchmarks/*_probe.py) share: the launch floor (an empty kernel of a
given grid), the timing row, the bandwidth row, and the main loop that prints one JSON row per
variant and rewrites the output file after every row (a run cut off by its time limit keeps what
it measured)."""

from __future__ import annotations

import argparse
import json
from typing import Callable, Iterable

import cutlass.cute as cute
import torch

from kernels.common import compile_kernel, fake_rowmajor

ARCH = "sm_90a"


class EmptyKernel:
    """`grid` (an int or a 3-tuple) CTAs of `threads` threads that do nothing (a tensor argument
    carries the stream)."""

    def __init__(self, grid, threads: int):
        self.grid = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
        self.threads = threads

    @cute.jit
    def __call__(self, mT: cute.Tensor, stream):
        self.kernel().launch(grid=list(self.grid), block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self):
        pass


def empty_launch(grid, threads: int) -> Callable[[], object]:
    """One launch of an empty kernel of this grid: the floor of a launch of that shape."""
    compiled = compile_kernel(EmptyKernel(grid, threads), fake_rowmajor("fp32", (cute.sym_int(),)), arch=ARCH)
    t = torch.empty(4, device="cuda")
    return lambda: compiled(t)


def timed(timer, fn) -> dict:
    stats = timer.time(fn)
    return {"median_us": stats.median_ms * 1e3, "cv": stats.cv}


def copy_row(timer) -> dict:
    """A 256 MiB device copy: the run's streaming bandwidth."""
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row = timed(timer, lambda: dst.copy_(src))
    row.update(case="copy 256 MiB", variant="copy", tb_s=2 * src.numel() / row["median_us"] / 1e6)
    return row


def run_probe(rows_of: Callable[[object], Iterable[dict]], with_copy: bool = True) -> None:
    """`--out PATH`: the copy row (optional), then every row of rows_of(timer)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from dsv4bench.core.timing import CudaTimer

    timer = CudaTimer("cuda")
    rows = [copy_row(timer)] if with_copy else []
    for row in rows:
        print(json.dumps(row), flush=True)
    for row in rows_of(timer):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": rows}, f, indent=1)
