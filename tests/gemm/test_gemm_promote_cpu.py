"""The v6 candidate `cutedsl:promote-split` (kernels/gemm/promote_sm90.py) on the CPU: registered as a
checked variant (not the default), compiled for sm_90a from fake tensors at every configuration the
tile rule picks with no local memory and no serialised wgmma, the column halves of its temporary
mapped onto the accumulator's columns, and its SASS showing the interleaving it was built for: every
promotion burst is half the shipped one and all but one per chain of K blocks run with the
warpgroup's next wgmma group in flight (tests/gemm/promote_sass.py). GPU correctness:
tests/gemm/test_gemm_gpu.py (`test_promote_split`)."""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
import pytest
from cutlass.cute.nvgpu import warpgroup

from dsv4bench.compile.sass import find_nvdisasm, sass_of
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl, impls
from kernels.gemm.config import choose_config
from kernels.gemm.glue import compile_gemm
from kernels.gemm.promote_sm90 import HALVES, PromoteSplitSm90
from kernels.gemm.tiling import GemmConfig
from kernels.regs import mn_view
from sweeps.gemm import LAYERS, QUANT_GEMM, TOKENS
from tests.gemm.promote_sass import bursts, wgmma_shapes
from tests.wgmma_checks import assert_compiles_clean

NAME = "cutedsl:promote-split"
RULE_CONFIGS = sorted({choose_config(m, n, k, groups=g) for _, _, n, k, g in LAYERS for m in TOKENS}, key=str)
PREFILL = [GemmConfig(256, 128, cluster_n=2), GemmConfig(128, 128)]  # the rule's prefill tiles


def test_registered_checked_and_not_default():
    declared = {i.name: i for i in impls("gemm", variants=True)}
    assert NAME in declared and NAME not in {i.name for i in impls("gemm")}
    impl = declared[NAME]
    assert impl.checked and impl.kernel_class is PromoteSplitSm90
    case = Case("gemm", {"m": 4096, "n": 7168, "k": 16384, "groups": 1, "layer": "pro.wo_b"})
    shipped = get_impl("gemm", "cutedsl")
    assert impl.config(case) == shipped.config(case)  # the rule's tile, another schedule
    assert impl.compile_key(case, "sm_90a") != shipped.compile_key(case, "sm_90a")
    assert impl.supports(case, "sm_90a") is None
    assert "quantised operands only" in impl.supports(Case("gemm", {**case.params, "op": QUANT_GEMM}), "sm_90a")
    assert impl.supports(Case("gemm", {"m": 64, "n": 512, "k": 4096, "layer": "x", "op": "bf16"}), "sm_90a")


@pytest.mark.parametrize("cfg", RULE_CONFIGS, ids=str)
def test_compiles_without_spills_or_serialised_wgmma(cfg):
    assert_compiles_clean(functools.partial(compile_gemm, kernel_class=PromoteSplitSm90), cfg)


def test_temporary_halves_map_onto_the_accumulator_columns():
    """acc_mn[r, h * cols + c] and half h's tmp_mn[r, c] are the same (row, column) of the wave's
    tile, for every thread: what `_promote_half` relies on."""
    got = {}

    @cute.jit
    def probe():
        def mma(n):
            return sm90_utils.make_trivial_tiled_mma(
                cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, warpgroup.OperandMajorMode.K,
                warpgroup.OperandMajorMode.K, cutlass.Float32, (2, 1, 1), (64, n))

        for bn in (128, 64, 32):
            full, half = mma(bn), mma(bn // HALVES)
            for t in cutlass.range_constexpr(0, 256, 17):
                cf = mn_view(full.get_slice(t).partition_C(cute.make_identity_tensor((128, bn))))
                ch = mn_view(half.get_slice(t).partition_C(cute.make_identity_tensor((128, bn // HALVES))))
                cols = cute.size(ch, mode=[1])
                got[bn, t, "cols"] = (cute.size(cf, mode=[1]), cols)
                for r in cutlass.range_constexpr(cute.size(ch, mode=[0])):
                    for h in cutlass.range_constexpr(HALVES):
                        for c in cutlass.range_constexpr(cols):
                            got[bn, t, r, h, c] = (str(cf[r, h * cols + c]), str(ch[r, c]))

    cute.compile(probe, options="--gpu-arch sm_90a")
    pairs = {k: v for k, v in got.items() if k[2] != "cols"}
    assert len(pairs) > 100
    for (bn, t, r, h, c), (full, half) in pairs.items():
        fr, fc = eval(full)
        hr, hc = eval(half)
        assert (fr, fc) == (hr, hc + h * bn // HALVES), (bn, t, r, h, c, full, half)
    assert all(v[0] == HALVES * v[1] for k, v in got.items() if k[2] == "cols")


@functools.cache
def _sass(cfg: GemmConfig, variant: bool) -> str:
    return sass_of(compile_gemm(cfg, kernel_class=PromoteSplitSm90) if variant else compile_gemm(cfg))


@pytest.mark.skipif(find_nvdisasm() is None, reason="no nvdisasm")
@pytest.mark.parametrize("cfg", PREFILL, ids=str)
def test_sass_promotion_runs_under_the_next_wgmmas(cfg):
    """Shipped: per (K block, wave) one 64 x bn wgmma group, waited for with nothing left in flight,
    then a burst of bn / 2 FFMA. Candidate: 64 x bn/2 wgmmas; every burst bn / 4 FFMA; within a chain
    of K blocks every wait but the chain's last leaves the next unit's group in flight (DEPBAR.LE 1)."""
    half = cfg.bn // 4  # FFMA per thread per half temporary (64 x bn/2 fp32 over 128 threads)
    units = cfg.waves * HALVES  # per K block
    chain = PromoteSplitSm90.chain

    ship = _sass(cfg, False)
    assert wgmma_shapes(ship) == {f"QGMMA.64x{cfg.bn}x32.F32.E4M3.E4M3"}
    assert [(b.in_flight, b.ffma) for b in bursts(ship)] == [(0, 2 * half)] * cfg.waves

    cand = _sass(cfg, True)
    assert wgmma_shapes(cand) == {f"QGMMA.64x{cfg.bn // HALVES}x32.F32.E4M3.E4M3"}
    got = bursts(cand)
    assert all(b.ffma == half for b in got), got
    # the chain's code (chain blocks) then the tails (1 .. chain - 1 blocks), each ending in one
    # wait with nothing in flight
    lengths = [chain * units] + [r * units for r in range(chain - 1, 0, -1)]
    expect = [(1 if j < n - 1 else 0) for n in lengths for j in range(n)]
    assert [b.in_flight for b in got] == expect
    # a hidden burst is the FFMAs and at most a few instructions beside them (the stage release,
    # a scale move): nothing that waits
    assert sum(b.in_flight == 0 for b in got) == chain and sum(b.instrs <= half + 12 for b in got if b.in_flight) >= len(got) - chain - 2
