"""What ran where: GPU, driver, clocks, CUDA, library versions, commit (for run.json and `env`)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels", "flash-attn-4", "hypothesis")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit (+"-dirty"); DSV4BENCH_COMMIT names it where the tree has no .git
    (a copy shipped to a GPU host)."""
    if os.environ.get("DSV4BENCH_COMMIT"):
        return os.environ["DSV4BENCH_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def nvidia_smi() -> dict:
    """Clocks, power and driver from nvidia-smi (when present); NVML field names."""
    if not shutil.which("nvidia-smi"):
        return {}
    fields = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(zip(fields.split(","), [v.strip() for v in out[0].split(",")])) if out else {}


def describe_environment() -> dict:
    import torch

    env = {
        "python": platform.python_version(), "host": platform.node(), "machine": platform.machine(),
        "commit": git_commit(), "packages": {p: _version(p) for p in PACKAGES if _version(p)},
        "cuda_runtime": torch.version.cuda, "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "name": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1), **nvidia_smi(),
        }
    return env
