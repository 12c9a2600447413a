"""The tracked tree stays under its budget (README: the device tool carries the tree beside CuTeDSL, tvm-ffi and the
peer bundles, at most 64 MiB in all; with the bundles the tree must stay under ~3 MiB)."""

import shutil
import subprocess
from pathlib import Path

import pytest

TREE_BUDGET_BYTES = 3 << 20
ROOT = Path(__file__).resolve().parents[2]


def test_the_tracked_tree_fits_its_budget():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    total = sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())
    assert 0 < total <= TREE_BUDGET_BYTES, f"tracked tree {total:,} B over {TREE_BUDGET_BYTES:,} B: move superseded runs to git history"
