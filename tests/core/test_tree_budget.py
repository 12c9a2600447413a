"""The tracked tree stays under its budget (README: the device tool carries the tree beside CuTeDSL, tvm-ffi and the
peer bundles, at most 64 MiB in all). The four bundles of ../shared/gpu-site take 60,844,264 B of the 67,108,864, so
6.26 MB are left for the tree and .gpu's scripts; the budget keeps ~2.9 MB of that spare."""

import shutil
import subprocess
from pathlib import Path

import pytest

TREE_BUDGET_BYTES = 13 << 18  # 3.25 MiB
ROOT = Path(__file__).resolve().parents[2]


def test_the_tracked_tree_fits_its_budget():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    total = sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())
    assert 0 < total <= TREE_BUDGET_BYTES, f"tracked tree {total:,} B over {TREE_BUDGET_BYTES:,} B: move superseded runs to git history"
