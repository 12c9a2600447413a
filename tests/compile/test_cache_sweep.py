"""A second `dsv4bench sweep FAMILY --compile-only` compiles nothing: every kernel comes from the disk
cache (or the worker's memory) and its compile phase is >= 5x faster; --no-cache compiles again.
Run for rmsnorm, and for fmha once that family is registered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bench.core.registry import families

SWEEP = ["--compile-only", "--examples", "0", "--arch", "sm_90a"]
# The whole production grid's kernels, at the options that keep the CPU reference checks short.
NARROW = {"rmsnorm": ["--rows", "64"], "fmha": ["--hd", "64"]}


def sweep(tmp: Path, family: str, name: str, *extra: str) -> tuple[list[dict], float]:
    env = {**os.environ, "DSV4BENCH_CACHE_DIR": str(tmp / "cache")}
    env.pop("DSV4BENCH_NO_KERNEL_CACHE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsv4bench", "sweep", family, *SWEEP, *extra, "--out", str(tmp / name)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp / name / "results.jsonl").read_text().splitlines()]
    return [r for r in records if r["mode"] == "compile"], wall


def origins(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r["compile"]["cache"]] = out.get(r["compile"]["cache"], 0) + 1
    return out


@pytest.mark.parametrize("family", [f for f in NARROW if f in families()])
def test_second_sweep_compiles_nothing_and_its_compile_phase_is_5x_faster(tmp_path, family):
    first, first_wall = sweep(tmp_path, family, "first", *NARROW[family])
    second, second_wall = sweep(tmp_path, family, "second", *NARROW[family])
    print(f"\n{family}: {len(first)} compile tasks; first {origins(first)}, second {origins(second)}")
    assert len(first) == len(second) and all(r["status"] == "COMPILED" for r in first + second)
    assert set(origins(first)) <= {"miss", "memory"} and origins(first)["miss"] >= 1
    assert set(origins(second)) <= {"disk", "memory"}  # zero compiles
    assert origins(second)["disk"] == origins(first)["miss"]  # each kernel loaded once per worker
    phase1 = sum(r["compile"]["seconds"] for r in first)  # compile + export + store
    phase2 = sum(r["compile"]["seconds"] for r in second)  # verify + load
    print(f"compile phase: first {phase1:.2f} s, second {phase2:.3f} s ({phase1 / phase2:.0f}x); "
          f"sweep wall: first {first_wall:.1f} s, second {second_wall:.1f} s")
    assert phase1 >= 5 * phase2
    by_case = {r["case_id"]: r["compile"] for r in first}
    for r in second:  # the same kernel: resources and lint results come back with it
        for k in ("cubin_bytes", "registers", "local_bytes", "static_smem_bytes", "lints"):
            assert r["compile"][k] == by_case[r["case_id"]][k]


def test_no_cache_flag_compiles_cold(tmp_path):
    warm, _ = sweep(tmp_path, "rmsnorm", "warm", "--rows", "64", "--width", "128")
    cold, _ = sweep(tmp_path, "rmsnorm", "cold", "--rows", "64", "--width", "128", "--no-cache")
    assert origins(warm) == origins(cold) == {"miss": len(cold)}  # cached by the first, compiled again


def test_a_sweep_fails_linted_cases_with_fail_lint(tmp_path):
    here = str(Path(__file__).parent)
    env = {**os.environ, "DSV4BENCH_CACHE_DIR": str(tmp_path / "cache"), "DSV4BENCH_PLUGINS": "planted_family",
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "dsv4bench", "sweep", "planted", *SWEEP, "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # FAIL_LINT exits 1
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    status = {r["params"]["bug"]: (r["status"], r["reason"]) for r in records if r["mode"] == "compile"}
    assert status[None] == ("COMPILED", "")
    for bug, rule in (("slice", "tma-tile-mode"), ("tx", "tx-count"), ("arrive", "arrive-count")):
        assert status[bug][0] == "FAIL_LINT" and status[bug][1].startswith(rule)
    assert "FAIL_LINT" in proc.stdout
