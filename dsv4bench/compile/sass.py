"""The SASS of a compiled kernel: `nvdisasm` on the cubin CuTeDSL keeps. For checks on the
instruction order ptxas chose, which neither the PTX nor CuTeDSL shows: ptxas schedules
register-only work freely across wgmma waits and named-barrier arrives (docs/lessons/fmha.md,
23 and 25).

nvdisasm comes from $DSV4BENCH_NVDISASM, else PATH, else the pip wheel `nvidia-cuda-nvdisasm`
(a dev dependency: nvidia/*/bin/nvdisasm on sys.path), else beside the ptxas found. Without it,
`sass_of` returns None.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.ptxas import TIMEOUT_S, find_ptxas

ENV = "DSV4BENCH_NVDISASM"


def find_nvdisasm() -> str | None:
    env = os.environ.get(ENV, "").strip()
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else shutil.which(env)
    found = shutil.which("nvdisasm")
    if found:
        return found
    candidates = [c for site in sys.path for c in glob.glob(os.path.join(site, "nvidia", "*", "bin", "nvdisasm"))]
    ptxas = find_ptxas()
    if ptxas:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(ptxas)), "nvdisasm"))
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def sass_of(compiled) -> str | None:
    """SASS text of a compiled function's cubin, or None without nvdisasm or a kept cubin."""
    exe, cubin = find_nvdisasm(), artifact(compiled, "__cubin__")
    if not (exe and cubin):
        return None
    with tempfile.TemporaryDirectory(prefix="dsv4bench-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([exe, "-c", str(path)], check=True, capture_output=True, text=True,
                              timeout=TIMEOUT_S).stdout
