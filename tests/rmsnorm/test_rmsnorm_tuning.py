"""RMSNorm tuning knob sets (kernels/rmsnorm/variants.py, declared as `cutedsl:<name>` variants):
every one compiles for sm_100a without a GPU and spills nothing (sm_90a: test_rmsnorm_variants.py),
the knobs emit the cache hints they name; on a GPU every one matches the oracle on ragged widths and
rows without writing outside its output."""

from __future__ import annotations

import re

import pytest
from cutlass import cute
from cutlass.cute.runtime import make_fake_stream

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from kernels.common import CUTE_DTYPES, POLICY, fake_rowmajor
from kernels.rmsnorm.family import compile_rmsnorm
from kernels.rmsnorm.rmsnorm import RmsNormConfig, RmsNormKernel
from kernels.rmsnorm.variants import knob_sets

BENCH_WIDTHS = (7168, 4096, 512)
ALL_VARIANTS = knob_sets()  # name -> knobs (a name means the same knobs at every width)


def _fits(n: int, knobs: dict) -> bool:
    try:
        RmsNormConfig.for_width(n, 16, **knobs)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("arch", ["sm_100a"])
@pytest.mark.parametrize(
    "n, name", [(next(n for n in (7168, 512, 4096) if _fits(n, knobs)), name) for name, knobs in ALL_VARIANTS.items()]
)
def test_variant_compiles_without_gpu(arch, n, name):
    compiled = compile_rmsnorm("bf16", n, True, arch, **ALL_VARIANTS[name])
    info = parse_cubin(artifact(compiled))
    assert info.sm == int(arch[3:-1])
    assert (
        info.registers is not None and info.registers <= 255 and info.local_bytes == 0
    )  # no spills


def _ptx(knobs: dict, n: int = 7168) -> str:
    rows = cute.sym_int()
    x, o, w = (
        fake_rowmajor("bf16", (rows, n)),
        fake_rowmajor("bf16", (rows, n)),
        fake_rowmajor("bf16", (n,)),
    )
    kernel = RmsNormKernel(CUTE_DTYPES["bf16"], n, True, 1e-6, **knobs)
    opts = f"--gpu-arch sm_90a --enable-tvm-ffi --keep-ptx --dump-dir={POLICY.dump()}"
    compiled = cute.compile(
        kernel, x, w, o, make_fake_stream(use_tvm_ffi_env_stream=True), options=opts
    )
    return artifact(compiled, "__ptx__").decode()


@pytest.mark.parametrize(
    "knobs, load, store",
    [
        ({"load_hint": "none"}, "ld.global.v4.b32", "st.global.v4.b32"),  # any knob: the one-pass split
        ({"load_hint": "na"}, "ld.global.L1::no_allocate.v4.b32", "st.global.v4.b32"),
        ({"load_hint": "ef"}, "ld.global.L1::evict_first.v4.b32", "st.global.v4.b32"),
        (
            {"load_hint": "cs", "store_hint": "cs"},
            "ld.global.cs.v4.b32",
            "st.global.cs.v4.b32",
        ),
        (
            {"load_hint": "nc", "store_hint": "na"},
            "ld.global.nc.v4.b32",
            "st.global.L1::no_allocate.v4.b32",
        ),
        (
            {"load_hint": "na_l2ef", "store_hint": "l2ef"},
            "ld.global.L1::no_allocate.L2::cache_hint.v4.b32",
            "st.global.L2::cache_hint.v4.b32",
        ),
    ],
)
def test_cache_hints_reach_the_ptx(knobs, load, store):
    ptx = _ptx(knobs)
    x_loads = set(re.findall(r"ld\.global[\w:.]*", ptx)) - {
        "ld.global.v4.b32"
    }  # the weight stays plain
    assert x_loads == ({load} if load != "ld.global.v4.b32" else set())
    assert set(re.findall(r"st\.global[\w:.]*", ptx)) == {store}
    assert ("createpolicy.fractional.L2::evict_first" in ptx) == (
        "l2ef" in knobs.get("store_hint", "")
    )


@pytest.mark.parametrize(
    "knobs, first, again",
    [
        ({"reload_hint": "none", "w_early": False}, "ld.global.v4.b32", "ld.global.v4.b32"),
        (
            {"load_hint": "el_l2el", "reload_hint": "ef_l2ef", "w_early": False},
            "ld.global.L1::evict_last.L2::cache_hint.v4.b32",
            "ld.global.L1::evict_first.L2::cache_hint.v4.b32",
        ),
    ],
)
def test_reload_reads_x_twice(knobs, first, again):
    ptx = _ptx(knobs)  # 7168 = 128 threads x 7 vectors
    loads = re.findall(r"ld\.global[\w:.]*", ptx)
    # x, x again after the reduction, the weight (plain): 7 vectors each
    assert sorted(loads) == sorted([first] * 7 + [again] * 7 + ["ld.global.v4.b32"] * 7)
    assert re.findall(r"st\.global[\w:.]*", ptx) == ["st.global.v4.b32"] * 7
    for policy in ("evict_last", "evict_first"):
        assert (f"createpolicy.fractional.L2::{policy}" in ptx) == (policy in first + again)


def test_overrides_cover_the_row_exactly_once():
    for n in (512, 1000, 4096, 4416, 7168):
        for t in (t for t in (16, 32, 64, 128, 256) if n // 8 / 32 <= t <= n // 8):
            cfg = RmsNormConfig.for_width(n, 16, threads_per_row=t, tiles_per_cta=4)
            assert (
                cfg.threads_per_row == t
                and cfg.cols_per_tile >= n > cfg.cols_per_tile - cfg.vec * t
            )
            assert cfg.threads >= 128 and cfg.knobs == {"tiles_per_cta": 4}
    with pytest.raises(ValueError):
        RmsNormConfig.for_width(4096, 16, threads_per_row=96)
    with pytest.raises(ValueError):
        RmsNormConfig.for_width(
            512, 16, threads_per_row=128
        )  # more threads than vectors
    with pytest.raises(ValueError):
        RmsNormConfig.for_width(512, 16, load_hint="bogus")
    with pytest.raises(ValueError):
        RmsNormConfig.for_width(512, 16, reload_hint="bogus")
    with pytest.raises(ValueError):
        RmsNormConfig.for_width(512, 16, reload_hint="none", tiles_per_cta=2)


GPU_CASES = [
    {"m": 1, "n": 7168, "dtype": "bf16", "weight": True},
    {"m": 4097, "n": 4096, "dtype": "bf16", "weight": True},
    {"m": 333, "n": 512, "dtype": "bf16", "weight": False},
    {"m": 129, "n": 1000, "dtype": "fp16", "weight": True},
    {"m": 17, "n": 133, "dtype": "fp32", "weight": True},
    {"m": 1105, "n": 4416, "dtype": "bf16", "weight": False},
    {"m": 727, "n": 882, "dtype": "bf16", "weight": True},
    {
        "m": 3001,
        "n": 7168,
        "dtype": "bf16",
        "weight": True,
    },  # ragged rows over several loop tiles
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ALL_VARIANTS))
@pytest.mark.parametrize(
    "params",
    GPU_CASES,
    ids=lambda p: f"{p['m']}x{p['n']}-{p['dtype']}-w{int(p['weight'])}",
)
def test_variant_matches_oracle_on_gpu(params, name, gpu_check):
    """Through the one evaluation path (gpu_check: poisoned output between canary pads, inputs
    checked unchanged, the oracle rule)."""
    impl = get_impl("rmsnorm", f"cutedsl:{name}")
    case = Case("rmsnorm", params, 11)
    why = impl.supports(case)
    if why:
        pytest.skip(why)  # e.g. more threads per row than the row has vectors
    gpu_check(case, impl)
