"""dsv4bench/core/deadline.py: a block past its deadline ends the process even while the main thread is blocked in
C code (a hung kernel's stand-in: a lock wait), after what the process wrote before it; a block that ends in time is
never ended later; the benchmark scripts refuse a negative --timeout."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bench.core.deadline import case_deadline

ROOT = Path(__file__).parents[2]


def _run(body: str, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    code = ("import threading, time\nfrom dsv4bench.core.deadline import case_deadline\n"
            f"open({str(tmp_path / 'before.jsonl')!r}, 'w').write('kept')\n" + body)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    return done, time.monotonic() - t0


def test_a_blocked_case_ends_the_process_and_keeps_what_came_before(tmp_path):
    done, took = _run("lock = threading.Lock()\nlock.acquire()\n"
                      "with case_deadline(1.5, 'flash T=1 cutedsl'):\n    lock.acquire()\n", tmp_path)
    assert done.returncode != 0 and took < 30
    assert "[deadline 1.5 s] flash T=1 cutedsl" in done.stderr and "Timeout" in done.stderr
    assert (tmp_path / "before.jsonl").read_text() == "kept"


def test_a_case_that_ends_in_time_is_not_ended_later(tmp_path):
    done, _ = _run("with case_deadline(1.0, 'quick'):\n    pass\ntime.sleep(2.5)\nprint('after')\n", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "after"


def test_no_deadline_and_bad_deadlines():
    with case_deadline(0, "none"):
        pass
    with case_deadline(None, "none"):
        pass
    with pytest.raises(ValueError, match="positive"):
        with case_deadline(-1, "bad"):
            pass
    for script in ("moe_stages.py", "moe_phases.py"):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--timeout", "-1"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2 and "--timeout must be >= 0" in done.stderr, (script, done.stderr[-300:])
