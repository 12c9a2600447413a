"""The embedded default checkpoint: the tiny synthetic one, generated once into the user cache.

Location: $DSV4BENCH_CACHE_DIR/tiny-ckpt-v2 (default ~/.cache/dsv4bench/tiny-ckpt-v2). It is
written to a temporary sibling and renamed into place, so concurrent first uses are safe.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from dsv4bench.model.config import TINY
from dsv4bench.model.synth import write_checkpoint

DEFAULT_SEED = 0
DEFAULT_NAME = "tiny-ckpt-v2"  # bump when the synthesis rules change


def cache_dir() -> Path:
    return Path(os.environ.get("DSV4BENCH_CACHE_DIR") or Path.home() / ".cache" / "dsv4bench")


def default_checkpoint() -> Path:
    target = cache_dir() / DEFAULT_NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_NAME}-", dir=target.parent))
    try:
        write_checkpoint(TINY, tmp, seed=DEFAULT_SEED)
        try:
            tmp.rename(target)
        except OSError:  # another process got there first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
