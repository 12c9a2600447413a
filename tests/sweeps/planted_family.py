"""A toy family with a planted bug, loaded into real sweeps through DSV4BENCH_PLUGINS=planted_family.

Its low-precision reference (what a CPU sweep checks against the FP32 oracle) is a row-wise
scale whose last column is wrong whenever the width is 13, a tile boundary + 1 of a 12-wide
tile: a sweep that contains n=13 fails exactly there. The production grid avoids n=13, so only
`--width 13` (or the regression file) brings the failing case in.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, SweepOptions, Tolerance, register_family, register_impl
from planted import BUGGY_WIDTH, GRID, NAME


class PlantedFamily(Family):
    name = NAME
    description = "test-only: scale rows by 2, with a planted bug at n=13"
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    options = {"width": Option("n", "row width", "elements")}

    def cases(self, opts: SweepOptions) -> list[Case]:
        widths = opts.filters.get("width")
        params = [{"m": 3, "n": n} for n in widths] if widths else GRID
        return [Case(self.name, p, opts.seed, "cli" if widths else "grid") for p in params]

    def make_inputs(self, case, gen, device):
        return {"x": torch.randn(case["m"], case["n"], generator=gen).to(device)}

    def oracle(self, case, inputs):
        return {"out": inputs["x"].double() * 2}

    def lowprec(self, case, inputs):
        out = inputs["x"] * 2
        if case["n"] == BUGGY_WIDTH:
            out[:, -1] += 1.0  # the planted bug: the ragged last column is off
        return {"out": out}

    def alloc_outputs(self, case, device):
        return {"out": torch.empty(case["m"], case["n"], device=device)}

    def cost(self, case):
        return Cost(flops=float(case["m"] * case["n"]), bytes=8.0 * case["m"] * case["n"])


class PlantedTorch(Impl):
    family, name, backend = NAME, "torch", "torch"
    archs = ("any",)
    needs_gpu = False

    def run(self, case, inputs, out, compiled):
        return {"out": inputs["x"] * 2}


register_family(PlantedFamily())
register_impl(PlantedTorch())
