"""Lint `wgmma-serialized`: read ptxas's performance messages, which CuTeDSL never shows.

CuTeDSL runs ptxas in-process and drops its info log, so a message such as

    ptxas info : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due
    to program dependence on compiler-inserted WG.AR in divergent path in the function '...'

goes unseen although every wgmma of the kernel then waits for the one before (the SM90 attention
kernel lost 15% to one `if` around a wgmma). For an sm_90a / sm_100a compile, when a ptxas is found,
`compile_kernel` keeps the PTX (--keep-ptx) and `check` runs `ptxas -arch=<arch> -v` on it once per
fresh compile (about 1 s for the biggest kernel; cache hits reuse the stored result). Its result is
a lint fact (`{"rule": "wgmma-serialized", ...}`) added to the compile's Recording, so it is stored
with the cached kernel and linted like the layout facts:

  serialized  every "wgmma.mma_async instructions are serialized" message (C7520 and its siblings,
              e.g. C7514): a lint finding (FAIL_LINT in sweeps, a warning in `dsv4bench layouts`)
  injected    "warpgroup.arrive / warpgroup.wait is injected" (C7519, C7517): a note only, in the
              compile info's `ptxas` field

No ptxas (DSV4BENCH_PTXAS, PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda*/bin): the fact
says "skipped: no ptxas", one line goes to stderr per process, nothing fails. A ptxas older than the
PTX's ISA (the lent H100's CUDA 13.0 ptxas against CuTeDSL 4.8's PTX 9.4) is the same: "skipped:
ptxas older than the PTX", one line, nothing fails. DSV4BENCH_PTXAS=off
turns the check off; DSV4BENCH_PTXAS=/path/to/ptxas picks the binary.

The compile cache hands `keep_ptx` to kernels/common.py's compile policy; this module imports
nothing from dsv4bench but the leaf `artifacts`.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsv4bench.compile.artifacts import artifact, compiled_functions

RULE = "wgmma-serialized"
ARCHS = ("sm_90a", "sm_100a")  # the warpgroup-MMA targets ptxas is asked about
ENV = "DSV4BENCH_PTXAS"
OFF = ("off", "0", "no", "none", "false")
TIMEOUT_S = 300
SKIPPED_NO_PTXAS = "skipped: no ptxas"
SKIPPED_TOO_OLD = "skipped: ptxas older than the PTX"
_TOO_OLD = re.compile(r"Unsupported \.version [\d.]+; current version is '[\d.]+'")

_FUNCTION = re.compile(r"\s+in (?:the )?function '([^']*)'\s*$")
_MESSAGE = re.compile(r"ptxas info\s*:\s*\((C\d+)\)\s*(.*)$")
_LINE = re.compile(r"in around line (\d+)")
_warned = False


def find_ptxas() -> str | None:
    """The ptxas to run: $DSV4BENCH_PTXAS (a path; off/0/none disables), else PATH, else
    $CUDA_HOME/bin or $CUDA_PATH/bin, else the newest /usr/local/cuda*/bin."""
    env = os.environ.get(ENV, "").strip()
    if env:
        if env.lower() in OFF:
            return None
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else shutil.which(env)
    found = shutil.which("ptxas")
    if found:
        return found
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    homes += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), key=_version, reverse=True)]
    for home in filter(None, homes):
        exe = os.path.join(home, "bin", "ptxas")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


def _version(path: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", os.path.basename(path)))


def keep_ptx(arch: str) -> bool:
    """Whether a compile for `arch` should keep its PTX for the check (kernels/common.py)."""
    return arch in ARCHS and find_ptxas() is not None


def parse(log: str) -> tuple[list[dict], list[dict]]:
    """(serialized, injected) messages of a `ptxas -v` log: {code, message, function[, line]}."""
    serialized, injected = [], []
    for raw in log.splitlines():
        m = _MESSAGE.search(raw)
        if not m:
            continue
        code, text = m.groups()
        fn = _FUNCTION.search(text)
        function = fn.group(1) if fn else ""
        text = " ".join(text[: fn.start()].split()) if fn else " ".join(text.split())
        if "wgmma.mma_async instructions are serialized" in text:
            serialized.append({"code": code, "message": text, "function": function})
        elif re.search(r"warpgroup\.\w+ is injected", text):
            line = _LINE.search(text)
            injected.append({"code": code, "message": text, "function": function,
                             "line": int(line.group(1)) if line else None})
    return serialized, injected


def run_ptxas(exe: str, ptx: bytes, arch: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="dsv4bench-ptxas-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_bytes(ptx)
        proc = subprocess.run([exe, f"-arch={arch}", "-v", str(src), "-o", os.devnull],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def check(compiled, arch: str) -> dict | None:
    """The `wgmma-serialized` fact of a fresh compile, or None when `arch` has no warpgroup MMA."""
    global _warned
    if arch not in ARCHS:
        return None
    fact = {"rule": RULE, "stage": f"ptxas {arch}", "status": "ok", "serialized": [], "injected": []}
    exe = find_ptxas()
    if exe is None:
        fact["status"] = SKIPPED_NO_PTXAS
        if not _warned and os.environ.get(ENV, "").strip().lower() not in OFF:
            _warned = True
            print(f"dsv4bench: lint {RULE} {SKIPPED_NO_PTXAS} (looked at ${ENV}, PATH, $CUDA_HOME/bin, "
                  f"/usr/local/cuda*/bin)", file=sys.stderr, flush=True)
        return fact
    # a compile of several kernels (a `kernels` dict: moe's layer, fmha's decode) is checked kernel by kernel
    ptxs = [artifact(f, "__ptx__") for f in compiled_functions(compiled)]
    if not all(ptxs):
        fact["status"] = "skipped: PTX not kept (compile with kernels.common.compile_kernel)"
        return fact
    t0 = time.perf_counter()
    for ptx in ptxs:
        _check_ptx(exe, ptx, arch, fact)
        if fact["status"] != "ok":
            break
    fact["seconds"] = round(time.perf_counter() - t0, 3)
    return fact


def _check_ptx(exe: str, ptx: bytes, arch: str, fact: dict) -> None:
    """ptxas on one kernel's PTX; its notes join `fact`, a failure sets its status."""
    global _warned
    try:
        rc, log = run_ptxas(exe, ptx, arch)
    except (OSError, subprocess.SubprocessError) as e:
        fact["status"] = f"error: {type(e).__name__}: {str(e)[:200]}"
        return
    too_old = _TOO_OLD.search(log)
    if rc != 0 and too_old:  # e.g. the GPU host's CUDA 13.0 ptxas reads PTX ISA <= 9.0 only
        fact["status"] = f"{SKIPPED_TOO_OLD} ({too_old.group(0)}; {exe})"
        if not _warned:
            _warned = True
            print(f"dsv4bench: lint {RULE} {fact['status']}: the lint needs a ptxas as new as "
                  f"CuTeDSL's PTX (CI has one; ${ENV} picks another)", file=sys.stderr, flush=True)
    elif rc != 0:  # report, never fail the case on it
        fact["status"] = f"error: ptxas exit {rc}: {' '.join(log.split())[-300:]}"
    else:
        serialized, injected = parse(log)
        fact["serialized"] += serialized
        fact["injected"] += injected


def summary(fact: dict | None) -> str:
    """One line for the compile info: 'ok (0.95 s)', 'skipped: no ptxas', with the notes."""
    if fact is None:
        return ""
    if fact["status"] != "ok":
        return fact["status"]
    text = f"ok ({fact.get('seconds', 0):.2f} s)"
    by_code: dict[str, list] = {}
    for m in fact["serialized"] + fact["injected"]:
        by_code.setdefault(m["code"], []).append(m)
    for code, ms in sorted(by_code.items()):
        what = "wgmma serialized (lint)" if "serialized" in ms[0]["message"] else \
            re.sub(r"\s+is injected.*", " injected", ms[0]["message"])
        lines = [str(m["line"]) for m in ms if m.get("line")]
        text += f"; {code} {what} x{len(ms)}" + (f" (PTX lines {', '.join(lines[:6])})" if lines else "")
    return text


def notes(fact: dict | None) -> list[str]:
    """The informational messages (injections) as short lines for a terminal."""
    if not fact:
        return []
    return [f"ptxas {m['code']}: {m['message']}" for m in fact["injected"]]
