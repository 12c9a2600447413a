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
import re
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


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*)")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def loop_spills(text: str, marker: str = "WARPGROUP.ARRIVE") -> list[str]:
    """Local-memory instructions (LDL / STL) inside an innermost loop whose body holds `marker` (default: a wgmma
    issue), i.e. the spills a K loop pays every block. A loop is a backward branch's range [its label, the branch];
    innermost: holding no other such loop. Spills outside them (a value kept in local memory across the K loop and
    reloaded once a tile) are not listed."""
    labels, instrs, pending = {}, [], []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            instrs.append((addr, m.group(2)))
    # the out-of-line slow paths of waits (after the body's last unconditional EXIT) branch back into the body:
    # not loops
    end = max((a for a, op in instrs if op.strip().startswith("EXIT")), default=instrs[-1][0] if instrs else 0)
    loops = [(labels[b.group(1)], addr) for addr, op in instrs
             if addr <= end and (b := _BRANCH.search(op)) and labels.get(b.group(1), addr + 1) <= addr]
    hot = [(lo, hi) for lo, hi in loops if any(lo <= a <= hi and marker in op for a, op in instrs)]
    hot = [(lo, hi) for lo, hi in hot if not any((lo, hi) != (l2, h2) and lo <= l2 and h2 <= hi for l2, h2 in hot)]
    return [f"{a:#06x} {op.strip()}" for a, op in instrs
            if re.match(r"(@!?U?P\w+\s+)?(LDL|STL)\b", op.strip()) and any(lo <= a <= hi for lo, hi in hot)]
