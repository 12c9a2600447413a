"""benchmarks/ncu_sass.py: an mbarrier wait loop's retries and sleep share read off an ncu source export."""

from __future__ import annotations

import csv
import importlib.util
import random
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("ncu_sass", Path(__file__).parents[2] / "benchmarks" / "ncu_sass.py")
ncu_sass = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ncu_sass)


def test_a_wait_loops_retries_and_sleep_share(tmp_path):
    rng = random.Random()
    waits, other, asleep = rng.randint(100, 10_000), rng.randint(1, 500), rng.randint(1, 1000)
    tries = waits + rng.randint(0, 30 * waits)  # every retry runs the loop again
    body = [("IMAD.U32 R24, RZ, RZ, UR11", waits, other), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R25], R24", tries, 0),
            ("@!P0  NANOSLEEP.SYNCS 0x989680", tries, asleep),
            ("@!P0  SYNCS.PHASECHK.TRANS64 P0, [R25], R24", tries, 0),
            ("@!P0  BRA 0x7f0", tries, 0), ("LEA R24, R208, UR13, 0xe", waits, 0)]
    if rng.random() < 0.5:  # a second loop the launch never ran (v24's export had one): left out, no division by 0
        body += [(source, 0, 0) for source, _runs, _samples in body]
    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerows([["Kernel Name", "k"], ["Source", ncu_sass.SAMPLES, ncu_sass.RUNS]])
        out.writerows([source, f"{samples:,}", f"{runs:,}"] for source, runs, samples in body)
    (line, source, n, retries, share), = ncu_sass.waits(ncu_sass.read(str(path)))
    assert (line, n) == (1, tries) and "TRYWAIT" in source
    assert abs(retries - (tries / waits - 1)) < 1e-12 and abs(share - asleep / (asleep + other)) < 1e-12
