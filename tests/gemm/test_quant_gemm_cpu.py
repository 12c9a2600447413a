"""quant + gemm on the CPU: the quant kernel's scales meet the GEMM's operand layout with no copy,
bad input is one error naming the tensor, the cases keep the committed ids, and every distinct
width of the production cases compiles for sm_90a (one function launching both kernels)."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from kernels.gemm.config import choose_config, choose_quant_gemm_config
from kernels.gemm.glue import fake_args, is_mn_major, make_operands, scales_for_tma
from kernels.gemm.quant_gemm import compile_quant_gemm, quant_operands
from sweeps import gemm as space
from tests.wgmma_checks import assert_compiles_clean

REPO = Path(__file__).resolve().parents[2]
# v8's product runs (M 1 / 8 / 64, M 256 / 4096) and v7's M 16384 run (the same cubins; benchmarks/results/INDEX.md):
# together every production GEMM shape
PRODUCT_RUNS = [REPO / f"benchmarks/results/gemm/{run}/results.jsonl.gz" for run in (
    "2026-11-27-h100-2a580a0-v10-decode", "2026-11-27-h100-1d64d7e-v8-prefill", "2026-11-26-h100-b3cccec-unroll-16384")]


def _bf16(m=16, n=256, k=256, groups=1):
    _, _, w, sw = make_operands(m, n, k, 0, "cpu", groups)
    return torch.randn(m, groups * k).bfloat16(), w, sw


@pytest.mark.parametrize("m", [1, 5, 64, 1001])
def test_scale_buffer_is_the_gemm_operand_layout(m):
    """The buffer the quant kernel writes is the MN-major sa the GEMM (and its TMA boxes) takes as
    is: stride (1, ld), ld = m rounded up to 4, 16-byte aligned columns."""
    x, w, sw = _bf16(m=m, k=512)
    codes, sa = quant_operands(x, w, sw)
    ld = -(-m // 4) * 4
    assert codes.shape == x.shape and codes.dtype == torch.uint8
    assert sa.shape == (m, 4) and sa.dtype == torch.float32 and sa.stride() == (1, ld) and is_mn_major(sa)
    assert scales_for_tma(sa, sw)[0] is sa  # no conversion or copy between the two kernels


def test_one_fake_scale_tensor_is_written_by_the_quant_kernel_and_read_by_the_gemm():
    """compile_quant_gemm hands the GEMM's own fake sa (fp32, MN-major) to the quant kernel."""
    import cutlass

    sa = fake_args(choose_config(64, 1024, 4096))[1]
    assert sa.element_type == cutlass.Float32 and sa.stride[0] == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda x, w, sw: (x.float(), w, sw), "x must be bfloat16"),
    (lambda x, w, sw: (x[0], w, sw), "x must be a 2-D tensor"),
    (lambda x, w, sw: (x.t(), w, sw), "x must be contiguous"),
    (lambda x, w, sw: (x.view(-1)[1:1 + x.numel() - 128].view(-1, 128), w, sw), "16-byte aligned"),
    (lambda x, w, sw: (x[:, :128].contiguous(), w, sw), "x has 128 columns, expected groups x K"),
    (lambda x, w, sw: (x, w, sw[:1]), "sw must have shape (2, 2)"),
    (lambda x, w, sw: (x, w.float(), sw), "w must be float8_e4m3fn"),
])
def test_bad_input_is_one_error_naming_the_tensor(mutate, message):
    with pytest.raises(ValueError) as e:
        quant_operands(*mutate(*_bf16()))
    assert message in str(e.value) and str(e.value).startswith("gemm: ")


def test_bad_output_and_groups_are_named():
    x, w, sw = _bf16()
    with pytest.raises(ValueError, match=r"gemm: out must have shape \(16, 256\)"):
        quant_operands(x, w, sw, torch.empty(16, 128, dtype=torch.bfloat16))
    x, w, sw = _bf16(n=384, groups=3)
    codes, sa = quant_operands(x, w, sw, groups=3)
    assert codes.shape == (16, 768) and sa.shape == (16, 6)
    with pytest.raises(ValueError, match="gemm: x has 768 columns, expected groups x K = 2 x 256"):
        quant_operands(x, w, sw, groups=2)


def test_every_shape_is_a_gemm_case_and_a_quant_gemm_case():
    plain = [p for p in space.production() if "op" not in p]
    quant = [p for p in space.production() if p.get("op") == space.QUANT_GEMM]
    assert len(plain) == len(space.LAYERS) * len(space.TOKENS) and quant == [{**p, "op": space.QUANT_GEMM}
                                                                          for p in plain]
    assert len([p for p in space.extra(6, 1) if p.get("op") != space.BF16]) == 12  # + the bf16 op's draws


def test_committed_case_ids_still_name_the_same_cases():
    """The product runs' grid records name cases the family still has, by id (draws depend on the
    hypothesis version that drew them)."""
    ids = {c.id for c in get_family("gemm").cases(SweepOptions(examples=0))}
    grid = []
    for run in PRODUCT_RUNS:
        with gzip.open(run, "rt") as f:
            grid += [r for r in map(json.loads, f) if r["origin"] == "grid"]
    recorded = {r["case_id"] for r in grid}
    plain = {r["case_id"] for r in grid if "op" not in r["params"]}  # the GEMM alone (no quant+gemm)
    assert len(plain) == len(space.LAYERS) * len(space.TOKENS) and recorded <= ids, sorted(recorded - ids)[:5]


def test_op_filter_selects_either_call():
    opt = get_family("gemm").options["op"]
    assert opt.parse("op", "gemm") == [None] and opt.parse("op", "quant+gemm") == [space.QUANT_GEMM]


def test_quant_gemm_cases_compile_with_their_own_key_and_peers_say_why_not():
    case = Case("gemm", {"m": 64, "n": 1024, "k": 4096, "groups": 1, "layer": "t", "op": space.QUANT_GEMM})
    plain = Case("gemm", {k: v for k, v in case.params.items() if k != "op"})
    ours = get_impl("gemm", "cutedsl")
    # the same tiles; at decode the quant+gemm GEMM is launched with PDL (config.choose_quant_gemm_config)
    key, plain_key = ours.compile_key(case, "sm_90a"), ours.compile_key(plain, "sm_90a")
    assert key[3] == replace(plain_key[3], pdl=True) and key[:3] + key[4:] == plain_key[:3] + (space.QUANT_GEMM, 4096)
    prefill = Case("gemm", {**case.params, "m": 4096})
    assert not ours.config(prefill).pdl and not ours.config(plain).pdl
    for peer in ("deepgemm", "cublaslt"):
        assert "takes quantised operands" in get_impl("gemm", peer).supports(case, "sm_90a")
        assert get_impl("gemm", "deepgemm").supports(plain, "sm_90a") is None


# every distinct width of the production quant+gemm cases (the grouped wo_a rows are 32768 and 65536
# wide: the quant kernel's column tiles), each with the rule's configuration at one token count
LAYER_OF_WIDTH = {g * k: (n, k) for _, _, n, k, g in space.LAYERS}
BUILDS = [(choose_quant_gemm_config(m, n, k), width) for width, (n, k) in sorted(LAYER_OF_WIDTH.items())
          for m in (64, 4096)]


@pytest.mark.parametrize("cfg,width", BUILDS, ids=[f"{c.bm}x{c.bn}s{c.split_k}-w{w}" for c, w in BUILDS])
def test_quant_gemm_compiles_without_spills_or_serialised_wgmma(cfg, width):
    assert_compiles_clean(lambda c: compile_quant_gemm(c, width), cfg)
