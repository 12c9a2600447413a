"""RMSNorm tuning variants (kernels/rmsnorm/rmsnorm.py: variants): every one compiles for both
archs without a GPU, spills nothing, and emits the cache hints it names; on a GPU every one
matches the oracle on ragged widths and rows without writing outside its output."""

from __future__ import annotations

import re

import pytest
import torch
from cutlass import cute
from cutlass.cute.runtime import make_fake_stream

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_family
from dsv4bench.core.worker import CaseData, poison
from kernels.common import CUTE_DTYPES, POLICY, fake_rowmajor
from kernels.rmsnorm.family import compile_rmsnorm
from kernels.rmsnorm.rmsnorm import RmsNormConfig, RmsNormKernel, variants

BENCH_WIDTHS = (7168, 4096, 512)
# every distinct knob set of the benchmark, by name (a name means the same knobs at every width)
ALL_VARIANTS = {
    name: knobs for n in BENCH_WIDTHS for name, knobs in variants(n).items()
}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize(
    "n, name", [(n, name) for n in (*BENCH_WIDTHS, 4416, 1000) for name in variants(n)]
)
def test_variant_compiles_without_gpu(arch, n, name):
    compiled = compile_rmsnorm("bf16", n, True, arch, **variants(n)[name])
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
def test_variant_matches_oracle_on_gpu(params, name):
    knobs = ALL_VARIANTS[name]
    dtype_width = {"bf16": 16, "fp16": 16, "fp32": 32}[params["dtype"]]
    try:
        RmsNormConfig.for_width(params["n"], dtype_width, **knobs)
    except ValueError as e:
        pytest.skip(str(e))  # e.g. more threads per row than the row has vectors
    fam = get_family("rmsnorm")
    case = Case("rmsnorm", params, 11)
    major, minor = torch.cuda.get_device_capability()
    compiled = compile_rmsnorm(
        params["dtype"], params["n"], params["weight"], f"sm_{major}{minor}a", **knobs
    )
    data = CaseData(fam, case, "cuda")
    x_before = data.inputs["x"].clone()
    # the output sits between canary pads: any store past its end or before its start shows
    m, n, pad = params["m"], params["n"], 4096
    slab = torch.full(
        (m * n + 2 * pad,), 7.0, dtype=data.inputs["x"].dtype, device="cuda"
    )
    out = {"out": slab[pad : pad + m * n].view(m, n)}
    poison(out)
    compiled(data.inputs["x"], data.inputs.get("w"), out["out"])
    torch.cuda.synchronize()
    assert torch.equal(data.inputs["x"], x_before), "the kernel wrote into its input"
    assert bool((slab[:pad] == 7).all() and (slab[pad + m * n :] == 7).all()), (
        "store out of bounds"
    )
    ok, metrics = compare_outputs(
        out, data.oracle, data.lowprec, lambda k: fam.tolerance_for(case, k)
    )
    assert ok, metrics["out"].reasons
