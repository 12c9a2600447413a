"""The indexer's compressor prefill (spec §5.4-§5.5 indexer branch, §6: m = 4, d = 128, Hadamard_128 + FP4
qdq), case parameter `indexer` of the compressor family (kernels/compressor/indexer.py) and the model op
`compressor_prefill(indexer=True)` it serves.

CPU: the kernel's shape checks, the compile for sm_90a / sm_100a from fake tensors (no local memory),
the main compressor's compile keys and case ids untouched, the sweep space (T 4096 / 16384, ragged
lengths, lengths not a multiple of m), the oracle glue (the low-precision reference passes the rule with a
non-zero error, outputs on the FP4 grid, a missing Hadamard caught), the adapter with the kernel's math
emulated in torch. GPU (marked `gpu`): the kernel against the FP32 oracle with fresh random inputs
(grid, flips), the sweep's indexer cases through the harness, the served op against its oracle."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.compile.artifacts import artifact, compiled_functions
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData, poison
from dsv4bench.core.registry import SweepOptions, Unsupported, get_family, get_impl
from kernels.common import compile_kernel
from kernels.compressor import serves
from kernels.compressor.family import fake_args, kernel_for
from kernels.compressor.indexer import IndexerCsaKernel
from oracles.hadamard import hadamard_rotate
from oracles.quant import FP4_AMAX_FLOOR, FP4_E2M1_MAX, round_to_e2m1, ue8m0_scale
from oracles.rope import rope_config_for_ratio, rope_freqs
from tests.reference import check_reference

D, M = 128, 4


def _case(b: int, s: int, seed: int = 0) -> Case:
    return Case("compressor", {"m": M, "b": b, "s": s, "d": D, "indexer": True, "dtype": "bf16"}, seed)


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return seed


def fp4_off_grid(x: torch.Tensor) -> int:
    """Values of x [..., 32·k] that are not e2m1 values times their block's ue8m0 scale. The scale is
    recomputed from the dequantised block: the qdq's own or half of it (a block whose amax rounded down
    to 3 codes), and on either every qdq'd value is an e2m1 value."""
    blocks = x.float().cpu().unflatten(-1, (-1, 32))
    scale = ue8m0_scale(blocks.abs().amax(-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR), FP4_E2M1_MAX)
    q = blocks / scale
    return int((round_to_e2m1(q) != q).sum())


# --- CPU ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, d", [(128, 128), (4, 512), (4, 256)])
def test_the_indexer_kernel_takes_only_m_4_d_128(m, d):
    with pytest.raises(ValueError):
        IndexerCsaKernel(m, d)
    case = Case("compressor", {"m": m, "b": 1, "s": 4096, "d": d, "indexer": True, "dtype": "bf16"})
    assert get_impl("compressor", "cutedsl").supports(case, "sm_90a")


def test_main_compressor_keys_and_ids_are_unchanged():
    impl = get_impl("compressor", "cutedsl")
    main = Case("compressor", {"m": 4, "b": 1, "s": 4096, "d": 128, "dtype": "bf16"})
    assert impl.compile_key(main, "sm_90a") == ("compressor", "cutedsl", "sm_90a", 4, 128, 1e-06)
    assert impl.compile_key(_case(1, 4096), "sm_90a") == (*impl.compile_key(main, "sm_90a"), "indexer")
    cases = get_family("compressor").cases(SweepOptions(examples=8, seed=9))
    assert all("indexer" not in c.params or c["indexer"] for c in cases), "a main case with an indexer key"
    assert type(kernel_for(main)).__name__ == "CsaKernel" and isinstance(kernel_for(_case(1, 8)), IndexerCsaKernel)


def test_the_space_holds_the_indexers_prefills_and_ragged_lengths():
    cases = [c for c in get_family("compressor").cases(SweepOptions(examples=8, seed=9)) if c.get("indexer")]
    assert all((c["m"], c["d"]) == (M, D) for c in cases)
    lengths = {(c["b"], c["s"]) for c in cases if c.origin == "grid"}
    assert {(1, 4096), (1, 16384), (2, 4096), (1, 4)} <= lengths
    assert {s % M for _, s in lengths} == {0, 1, 2, 3}, "lengths not a multiple of m"
    assert any(c.origin == "hypothesis" for c in cases)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_indexer_kernel_compiles_without_spills(arch):
    impl = get_impl("compressor", "cutedsl")
    case = _case(1, 4096)
    assert impl.supports(case, arch) is None
    for fn in compiled_functions(impl.compile(case, arch)):
        info = parse_cubin(artifact(fn))
        print(arch, f"{info.registers} registers, {info.local_bytes} B local, {info.cubin_bytes} B cubin")
        assert info.local_bytes == 0 and 0 < info.registers <= 128


@pytest.mark.parametrize("b, s", [(2, 43), (1, 4 * 37 + 3), (3, 8)])
def test_lowprec_reference_passes_the_rule_and_sits_on_the_fp4_grid(b, s):
    ok, metrics, data = check_reference(_case(b, s, 4))
    print({k: m.summary() for k, m in metrics.items()})
    assert ok and set(metrics) == {"out"}
    assert metrics["out"].max_abs > 0, "lowprec equal to the oracle: the bound is only a floor"
    assert data.oracle["out"].shape == (b, s // M, D)
    assert fp4_off_grid(data.oracle["out"]) == 0 and fp4_off_grid(data.lowprec["out"]) == 0


def test_a_missing_hadamard_or_qdq_fails_the_rule():
    fam = get_family("compressor")
    case = _case(2, 64, 5)
    data = CaseData(fam, case, "cpu")
    rotated_back = hadamard_rotate(data.oracle["out"].float())  # H is its own inverse: the qdq'd, unrotated entry
    unquantised = data.oracle["out"] + 1e-2 * torch.randn_like(data.oracle["out"])
    assert fp4_off_grid(unquantised) > unquantised.numel() // 2
    for wrong in (rotated_back, unquantised * 1.1):
        assert not check_reference(case, {"out": wrong})[0]


def _indexer_args(b: int, s: int, seed: int, device: str):
    from tests.gemm.served_checks import _norm_weight

    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(b, s, 2 * D, generator=gen).to(device)
    score = (2.0 * torch.randn(b, s, 2 * D, generator=gen) + 0.5).to(device)
    freqs = rope_freqs(rope_config_for_ratio(M)).to(device)
    return (kv, score, _norm_weight(D, gen, device), M, freqs), {"indexer": True, "qat": True}


def _kernel_math(params, inputs):
    """The indexer kernel's math on the CPU: fp32 pooling and norm, RoPE by the table row of s·m,
    Hadamard_128, FP4 qdq, one cast to bf16."""
    from oracles.compressor import block_candidates, pool
    from oracles.norm import rmsnorm
    from oracles.quant import fp4_qdq

    assert params["indexer"] and params["d"] == D
    c = rmsnorm(pool(*block_candidates(inputs["kv"], inputs["score"], params["m"])), inputs["norm_w"].float())
    rows = inputs["table"][torch.arange(c.shape[1]) * params["m"]].view(-1, 32, 2)  # (cos, sin) pairs
    pairs = torch.view_as_complex(c[..., -64:].reshape(*c.shape[:-1], 32, 2).contiguous())
    rotated = torch.view_as_real(pairs * torch.view_as_complex(rows.contiguous())).flatten(-2)
    return {"out": fp4_qdq(hadamard_rotate(torch.cat((c[..., :-64], rotated), -1)), 32).bfloat16()}


@pytest.mark.parametrize("b, s", [(2, 4 * 37 + 3), (1, 4), (3, 1001)])
def test_the_adapter_serves_the_indexer_with_its_table_rows(b, s, monkeypatch):
    """The kernel's math emulated (table rows included): the served rule against the op's FP32 oracle,
    and the oracle's FP4 values but for rare midpoint flips."""
    from dsv4bench.model.dispatch import OPS
    from tests.model import served_args as sa

    args, kwargs = _indexer_args(b, s, _seed(), "cpu")
    out = serves.compressor_prefill(_kernel_math, *args, **kwargs)
    want = OPS["compressor_prefill"].oracle(*args, **kwargs)
    assert out.shape == want.shape == (b, s // M, D) and out.dtype == torch.float32
    assert float((out != want).float().mean()) < 1e-2
    sa.assert_passes("compressor_prefill", out, args, kwargs, monkeypatch)


def test_the_adapter_refuses_what_the_indexer_kernel_does_not_take():
    from tests.model import served_args as sa

    args, kwargs = _indexer_args(1, 8, 1, "cpu")
    for change, why in (({"qat": False}, "QAT on"), ({"eps": 1e-5}, "eps")):
        with pytest.raises(Unsupported, match=why):
            serves.compressor_prefill(_kernel_math, *args, **dict(kwargs, **change))
    main_args, _ = sa.op_args("compressor_prefill", sa.SMALL, 8, seed=1, device="cpu")  # d = 512
    with pytest.raises(Unsupported, match="Hadamard"):
        serves.compressor_prefill(_kernel_math, *main_args, indexer=True)


# --- GPU ----------------------------------------------------------------------------------------------

GPU_CASES = [c for c in get_family("compressor").cases(SweepOptions(examples=12, seed=11)) if c.get("indexer")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_indexer_case_matches_the_oracle(case, gpu_check):
    outcome = gpu_check(case)
    assert fp4_off_grid(outcome.result["out"]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("b, s", [(1, 4096), (1, 16384), (2, 4099), (3, 1001), (1, 4), (1, 7), (5, 4 * 37 + 3)])
def test_indexer_kernel_matches_fp32_oracle_with_fresh_inputs(b, s):
    case = _case(b, s)
    fam = get_family("compressor")
    x = fam.make_inputs(case, torch.Generator().manual_seed(_seed()), "cuda")
    major, minor = torch.cuda.get_device_capability()
    kernel = compile_kernel(kernel_for(case), *fake_args(case), arch=f"sm_{major}{minor}a")
    out = fam.alloc_outputs(case, "cuda")
    poison(out)
    kernel(x["kv"], x["score"], x["norm_w"], x["table"], out["out"])
    torch.cuda.synchronize()
    got = {"out": out["out"].clone()}
    oracle = fam.oracle(case, x)
    ok, metrics = compare_outputs(got, oracle, fam.lowprec(case, x), lambda n: fam.tolerance_for(case, n))
    flips = float((got["out"].float() != oracle["out"].float()).float().mean())
    print(metrics["out"].summary(), f"values differing from the oracle's FP4 values: {flips:.2e}")
    assert ok
    assert fp4_off_grid(got["out"]) == 0, "values off the FP4 grid"
    assert flips < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("b, s", [(1, 4096), (2, 4096 + 3), (3, 1001), (1, 4), (1, 16384 + 1)])
def test_served_indexer_prefill_matches_its_oracle(b, s, monkeypatch):
    from dsv4bench.model.kernel_ops import served_ops
    from tests.model import served_args as sa

    args, kwargs = _indexer_args(b, s, _seed(), "cuda")
    out = served_ops()["compressor_prefill"](*args, **kwargs)
    assert out.device.type == "cuda" and out.shape == (b, s // M, D) and out.dtype == torch.float32
    sa.assert_passes("compressor_prefill", out, args, kwargs, monkeypatch)
