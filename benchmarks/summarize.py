"""One line per (case, impl) of a sweep's results.jsonl: status, median ms, cv and each impl's time
against a named peer's on the same case (peer / impl: > 1 is faster than the peer).

    python3 benchmarks/summarize.py RUN_DIR/results.jsonl --peer deepgemm
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path


def _records(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            yield json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results.jsonl(.gz) of a sweep run")
    ap.add_argument("--peer", default="", help="impl the ratios are taken against")
    args = ap.parse_args()
    if not Path(args.results).is_file():
        raise SystemExit(f"summarize: no results file {args.results!r} (a sweep's --out DIR/results.jsonl)")
    cases: dict[str, dict[str, dict]] = defaultdict(dict)
    params: dict[str, dict] = {}
    for r in _records(args.results):
        if r.get("mode") == "compile":
            continue
        cases[r["case_id"]][r["impl"]] = r
        params[r["case_id"]] = r["params"]
    for cid, by_impl in cases.items():
        print(cid, " ".join(f"{k}={v}" for k, v in sorted(params[cid].items())))
        peer = (by_impl.get(args.peer) or {}).get("timing") or {}
        for impl, r in sorted(by_impl.items()):
            t = r.get("timing") or {}
            line = f"  {impl:28s} {r['status']:11s}"
            if t:
                line += f" {t['median_ms'] * 1e3:9.1f} us  cv {t['cv']:.3f}"
                if peer:
                    line += f"  {args.peer}/this {peer['median_ms'] / t['median_ms']:.3f}"
            elif r.get("reason"):
                line += " " + r["reason"][:90]
            print(line)


if __name__ == "__main__":
    main()
