"""A second `dsv4bench sweep rmsnorm --compile-only` compiles nothing: every kernel comes from the disk
cache (or this process's memory) and its compile phase is >= 5x faster; --no-cache compiles again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The whole production grid's kernels (9 per arch) at the cheap row count, so the CPU checks stay short.
SWEEP = ["sweep", "rmsnorm", "--compile-only", "--examples", "0", "--arch", "sm_90a", "--rows", "64"]


def sweep(tmp: Path, name: str, *extra: str) -> tuple[list[dict], float]:
    env = {**os.environ, "DSV4BENCH_CACHE_DIR": str(tmp / "cache")}
    env.pop("DSV4BENCH_NO_KERNEL_CACHE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsv4bench", *SWEEP, *extra, "--out", str(tmp / name)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp / name / "results.jsonl").read_text().splitlines()]
    return [r for r in records if r["mode"] == "compile"], wall


def origins(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r["compile"]["cache"]] = out.get(r["compile"]["cache"], 0) + 1
    return out


def test_second_sweep_compiles_nothing_and_its_compile_phase_is_5x_faster(tmp_path):
    first, first_wall = sweep(tmp_path, "first")
    second, second_wall = sweep(tmp_path, "second")
    kernels = {(r["params"]["dtype"], r["params"]["n"], r["params"]["weight"]) for r in first}
    print(f"\n{len(first)} cases, {len(kernels)} kernels; first {origins(first)}, second {origins(second)}")
    assert len(first) == len(second) and all(r["status"] == "COMPILED" for r in first + second)
    assert origins(first).get("miss") == len(kernels) and set(origins(first)) <= {"miss", "memory"}
    assert set(origins(second)) <= {"disk", "memory"}  # zero compiles
    phase1 = sum(r["compile"]["seconds"] for r in first)  # compile + export + store
    phase2 = sum(r["compile"]["seconds"] for r in second)  # verify + load
    print(f"compile phase: first {phase1:.2f} s, second {phase2:.3f} s ({phase1 / phase2:.0f}x); "
          f"sweep wall: first {first_wall:.1f} s, second {second_wall:.1f} s")
    assert phase1 >= 5 * phase2
    by_case = {r["case_id"]: r["compile"] for r in first}
    for r in second:  # the same kernel: resources and lint results come back with it
        for k in ("cubin_bytes", "registers", "local_bytes", "static_smem_bytes", "lints"):
            assert r["compile"][k] == by_case[r["case_id"]][k]

    cold, _ = sweep(tmp_path, "cold", "--no-cache", "--width", "128")
    assert origins(cold).get("miss", 0) >= 1 and set(origins(cold)) <= {"miss", "memory"}  # nothing from disk
