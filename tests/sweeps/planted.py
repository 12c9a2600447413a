"""Real sweeps of the planted family (planted_family.py, loaded only by the sweep's processes
through DSV4BENCH_PLUGINS, never into the test process's registry)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

NAME = "planted"
BUGGY_WIDTH = 13
GRID = [{"m": m, "n": n} for m in (1, 7) for n in (8, 12, 24)]
REPO = Path(__file__).resolve().parents[2]


def _env(regressions: Path) -> dict[str, str]:
    return {**os.environ, "DSV4BENCH_PLUGINS": "planted_family", "DSV4BENCH_REGRESSIONS_DIR": str(regressions),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO), os.environ.get("PYTHONPATH", "")]),
            "CUDA_VISIBLE_DEVICES": ""}


def dsv4bench(regressions: Path, *args: str) -> subprocess.CompletedProcess:
    """The real CLI, with the planted family loaded and a private regressions directory."""
    return subprocess.run([sys.executable, "-m", "dsv4bench", *args], env=_env(regressions), capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def sweep(out: Path, regressions: Path, *args: str) -> subprocess.CompletedProcess:
    """A real `dsv4bench sweep planted` (CPU: oracle checks in an isolated worker)."""
    return dsv4bench(regressions, "sweep", NAME, "--out", str(out), *args)


@dataclass(frozen=True)
class TwoRuns:
    regressions: Path
    first: Path
    second: Path
    first_result: subprocess.CompletedProcess
    second_result: subprocess.CompletedProcess


@functools.lru_cache(maxsize=None)
def two_runs() -> TwoRuns:
    """Two real sweeps, made once per test session (tests/sweeps and tests/report share them):
    the first meets the planted bug (--width 8,13) and its failure is promoted (`regressions add`);
    the second's own cases avoid it, so only the regression file brings it back."""
    root = Path(tempfile.mkdtemp(prefix="dsv4bench-planted-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    regressions = root / "regressions"
    first = sweep(root / "run1", regressions, "--width", "8,13", "--seed", "5")
    dsv4bench(regressions, "regressions", "add", str(root / "run1"))
    second = sweep(root / "run2", regressions, "--seed", "5")
    return TwoRuns(regressions, root / "run1", root / "run2", first, second)
