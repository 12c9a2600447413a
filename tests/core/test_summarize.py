"""benchmarks/summarize.py: one line per (case, impl) with the peer's time over the impl's."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "summarize.py"


def _record(case, impl, ms, status="PASS", mode="bench"):
    timing = {"median_ms": ms, "cv": 0.01} if ms else None
    return {"case_id": case, "impl": impl, "status": status, "mode": mode, "params": {"t": 4096},
            "timing": timing, "reason": "" if ms else "no kernel for this shape"}


def test_ratios_against_the_peer_per_case(tmp_path):
    rows = [_record("c1", "cutedsl", 0.050), _record("c1", "deepgemm", 0.055),
            _record("c1", "cutedsl", None, "COMPILED", "compile"),  # compile records are left out
            _record("c2", "cutedsl", 0.200), _record("c2", "deepgemm", 0.100),
            _record("c2", "cutedsl:wg4", None, "UNSUPPORTED")]
    path = tmp_path / "results.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--peer", "deepgemm"], check=True,
                         capture_output=True, text=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("c1 t=4096") and lines[3].startswith("c2 t=4096")
    assert "50.0 us" in lines[1] and "deepgemm/this 1.100" in lines[1]
    assert "deepgemm/this 0.500" in lines[4]
    assert "UNSUPPORTED" in lines[5] and "no kernel for this shape" in lines[5]
    assert "COMPILED" not in out


def test_a_missing_results_file_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope.jsonl")], capture_output=True, text=True)
    assert run.returncode != 0 and run.stderr.strip().splitlines() == [
        f"summarize: no results file {str(tmp_path / 'nope.jsonl')!r} (a sweep's --out DIR/results.jsonl)"]
