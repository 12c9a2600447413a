"""Where a kernel's warps wait, per SASS line, from an ncu source-counter export (docs/lessons/moe.md 30):

    ncu --section SourceCounters --import-source no --export R ... ; ncu --import R.ncu-rep --page source --csv \
        --print-source sass > R.csv ; python3 benchmarks/ncu_sass.py R.csv [--top 20]

Prints the stalls, the opcodes and lines with the most samples, and each mbarrier wait loop's retries a wait."""

from __future__ import annotations

import argparse
import collections
import csv

SAMPLES, RUNS = "Warp Stall Sampling (All Samples)", "Instructions Executed"


def _n(text: str) -> int:
    digits = text.replace(",", "")
    return int(digits) if digits.isdigit() else 0


def read(path: str) -> list[dict]:
    """The export's instruction rows (line 1 names the kernel, line 2 the columns)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return [dict(zip(rows[1], row)) for row in rows[2:]]


def waits(lines: list[dict]) -> list[tuple[int, str, int, float, float]]:
    """(line, source, tries, retries a wait, share of samples asleep) of each mbarrier wait loop: TRYWAIT, a failed
    try's predicated NANOSLEEP and PHASECHK, the BRA back; the line after the BRA runs once a wait. A loop the
    sampled launch never ran (a kernel's other path) is left out."""
    total = sum(_n(r[SAMPLES]) for r in lines) or 1
    return [(i, r["Source"].strip(), _n(r[RUNS]), _n(r[RUNS]) / (_n(lines[i + 4][RUNS]) or _n(r[RUNS])) - 1,
             _n(lines[i + 1][SAMPLES]) / total)
            for i, r in enumerate(lines[:-4])
            if "TRYWAIT" in r["Source"] and "BRA" in lines[i + 3]["Source"] and _n(r[RUNS])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    lines = read(args.csv)
    samples = [_n(r[SAMPLES]) for r in lines]
    total = sum(samples) or 1
    stalls, ops = collections.Counter(), collections.Counter()
    for r, s in zip(lines, samples):
        stalls.update({k[6:]: _n(v) for k, v in r.items() if k.startswith("stall_") and "Not Issued" not in k})
        words = r["Source"].replace("@", " @").split()
        words = [w for w in words if not w.startswith("@")]
        if words:
            ops[words[0].split(".")[0]] += s
    print(f"{total} samples, {sum(_n(r[RUNS]) for r in lines)} warp instructions")
    print("stalls: " + ", ".join(f"{k} {v / total:.1%}" for k, v in stalls.most_common(10)))
    print("opcodes: " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(12)))
    for i in sorted(range(len(lines)), key=lambda j: -samples[j])[:args.top]:
        print(f"{i:5d} {samples[i] / total:6.2%} {_n(lines[i][RUNS]):>10} {lines[i]['Source'].strip()[:72]}")
    for i, source, tries, retries, asleep in waits(lines):
        print(f"wait {i:5d} {source[:60]:60s} tries {tries:>10} retries a wait {retries:6.2f} asleep {asleep:6.2%}")


if __name__ == "__main__":
    main()
