"""benchmarks/gemm_phases.py: each CTA's phases from its stamps, at its own clock, across a 32-bit wrap."""

import importlib.util
from pathlib import Path

import torch

from kernels.gemm.gemm_sm90 import (STAMP_ENTRY, STAMP_ENTRY_NS, STAMP_EXIT, STAMP_EXIT_NS, STAMP_FIRST_STAGE,
                                    STAMP_LOADS, STAMP_MAINLOOP, STAMP_MERGED)
from kernels.gemm.tiling import STAMP_SLOTS

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gemm_phases.py"
SPEC = importlib.util.spec_from_file_location("gemm_phases", SCRIPT)


def test_phases_read_each_cta_at_its_own_clock_and_across_a_wrap():
    phases = importlib.util.module_from_spec(SPEC)
    SPEC.loader.exec_module(phases)
    s = torch.zeros(3 * STAMP_SLOTS, dtype=torch.int64)
    # CTA c: entry at clock 2**32 - 1000 (it wraps), phases of 200 / 300 / 1000 / 100 / 400 cycles, 2 GHz; CTA 2 hands
    # its partial on (no merge stamp) and starts 500 ns after CTA 0
    for c, start_ns in enumerate((10_000, 10_200, 10_500)):
        row = s[c * STAMP_SLOTS:(c + 1) * STAMP_SLOTS]
        clocks = (2**32 - 1000) + torch.tensor([0, 200, 500, 1500, 1600, 2000])
        for slot, value in zip((STAMP_ENTRY, STAMP_LOADS, STAMP_FIRST_STAGE, STAMP_MAINLOOP, STAMP_MERGED, STAMP_EXIT),
                               clocks.tolist()):
            row[slot] = value % 2**32
        row[STAMP_ENTRY_NS], row[STAMP_EXIT_NS] = start_ns, start_ns + 1000
        if c == 2:
            row[STAMP_MERGED] = 0
    as_int32 = ((s + 2**31) % 2**32 - 2**31).to(torch.int32)  # the kernel's int32 slots (clocks past 2**31 negative)
    out = phases.phases(as_int32, 3)
    assert out["ghz_median"] == 2.0
    assert out["prologue"] == [100, 100] and out["first_stage"] == [150, 150] and out["mainloop"] == [500, 500]
    assert out["merge"] == [50, 50] and out["epilogue"] == [200, 200] and out["cta"] == [1000, 1000]
    assert out["start_spread"] == [200, 500] and out["span"] == 1500
