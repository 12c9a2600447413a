"""RMSNorm: the one CuTeDSL source compiles for both archs on a CPU; on a GPU it matches the oracle."""

from __future__ import annotations

import pytest

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cache import CompileCache
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_family, get_impl
from dsv4bench.core.evaluate import CaseData
from kernels.rmsnorm.rmsnorm import TWO_PASS_KNOBS, RmsNormConfig


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n, weight", [(7168, True), (512, False), (1000, True), (28672, False)])
def test_compiles_without_gpu(arch, n, weight, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path))  # a cold compile, whatever is cached
    case = Case("rmsnorm", {"m": 64, "n": n, "dtype": "bf16", "weight": weight})
    _, info = CompileCache().get(get_impl("rmsnorm", "cutedsl"), case, arch)
    assert info.cache == "miss" and info.cubin_bytes > 1000
    assert 0 < info.registers <= 128 and info.local_bytes == 0  # no spills
    compiled, _ = CompileCache().get(get_impl("rmsnorm", "cutedsl"), case, arch)
    assert parse_cubin(artifact(compiled)).sm == int(arch[3:-1])  # the cubin is for the asked arch


def test_config_covers_the_row_exactly_once():
    for n in (8, 100, 512, 1000, 4096, 7168, 16384, 28672):
        cfg = RmsNormConfig.for_width(n, 16)
        assert cfg.cols_per_tile >= n > cfg.cols_per_tile - cfg.vec * cfg.threads_per_row
        assert cfg.threads >= 32 and cfg.threads_per_row * cfg.rows_per_cta == cfg.threads


def test_wide_rows_default_to_the_two_pass_schedule():
    """Rows of >= 512 vectors take Inductor's schedule (<= 2 vectors per thread, x read twice with
    evict_last / evict_first); narrower rows and any explicit knob keep the one-pass split."""
    for n, threads in ((4096, 256), (7168, 512), (28672, 1024)):
        cfg = RmsNormConfig.for_width(n, 16)
        assert cfg.knobs == TWO_PASS_KNOBS and cfg.threads_per_row == threads
    assert RmsNormConfig.for_width(1536, 16).knobs == {}
    one_pass = RmsNormConfig.for_width(7168, 16, load_hint="na")
    assert one_pass.reload_hint is None and one_pass.vecs_per_thread > 2


def test_lowprec_reference_is_within_bf16_rounding_on_cpu():
    fam = get_family("rmsnorm")
    case = Case("rmsnorm", {"m": 37, "n": 7168, "dtype": "bf16", "weight": True}, 5)
    data = CaseData(fam, case, "cpu")
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, lambda n: fam.tolerance)
    assert ok and metrics["out"].max_abs > 0


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    {"m": 1, "n": 7168, "dtype": "bf16", "weight": True},
    {"m": 4097, "n": 4096, "dtype": "bf16", "weight": True},
    {"m": 333, "n": 512, "dtype": "bf16", "weight": False},
    {"m": 129, "n": 1000, "dtype": "fp16", "weight": True},
    {"m": 65, "n": 28672, "dtype": "bf16", "weight": False},
    {"m": 17, "n": 133, "dtype": "fp32", "weight": True},
    # widths whose CTA tile is wider than the row (the first sweep on the H100 caught these)
    {"m": 1105, "n": 4416, "dtype": "bf16", "weight": False},
    {"m": 727, "n": 882, "dtype": "bf16", "weight": False},
])
def test_matches_oracle_on_gpu(params, gpu_check):
    gpu_check(Case("rmsnorm", params, 11))
