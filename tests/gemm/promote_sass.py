"""What the SASS of a gemm kernel says about its promotion bursts (the v6 candidate's check,
tests/gemm/test_gemm_promote_cpu.py; the figures of docs/perf/gemm.md "v6 candidate").

A consumer warpgroup's wgmma waits are `WARPGROUP.DEPBAR.LE gsb0, N`: N groups may stay in flight.
After each wait, the FFMAs up to the next wgmma issue (WARPGROUP.ARRIVE / QGMMA), the next wait,
or an unconditional branch are its promotion burst. With N = 0 the warpgroup has nothing queued on
the tensor core while the burst runs (only the other warpgroup can fill it: exposed); with N >= 1
its own next wgmmas run under the burst (hidden)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")


def instructions(sass: str) -> list[tuple[str, str, str]]:
    """(predicate, opcode, operands) of every instruction, in text order."""
    return [(m.group(1) or "", m.group(2), m.group(3).strip())
            for m in map(_LINE.match, sass.splitlines()) if m]


@dataclass(frozen=True)
class Burst:
    in_flight: int  # N of the wait: the warpgroup's groups still queued while the burst runs
    ffma: int  # FFMAs before the next issue / wait / branch
    instrs: int  # every instruction in that stretch


def bursts(sass: str) -> list[Burst]:
    ins = instructions(sass)
    out = []
    for i, (_, op, args) in enumerate(ins):
        if op != "WARPGROUP.DEPBAR.LE":
            continue
        n = int(args.split(",")[-1], 16)
        ffma = count = 0
        for pred, op2, _ in ins[i + 1:]:
            if op2.startswith(("QGMMA", "HGMMA", "WARPGROUP.")) or (op2 in ("BRA", "EXIT") and not pred):
                break
            count += 1
            ffma += op2 == "FFMA"
        out.append(Burst(n, ffma, count))
    return out


def wgmma_shapes(sass: str) -> set[str]:
    return {op for _, op, _ in instructions(sass) if op.startswith(("QGMMA", "HGMMA"))}
