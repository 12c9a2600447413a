"""The ops on the bf16 GEMM (kernels/gemm/bf16_serves.py: lm_head, compressor_project,
indexer_weights) on the CPU, each kernel emulated (the GEMM by the exact fp32 product of its bf16
operands, mhc and rmsnorm by their families' torch references, refusing what the kernels' `supports`
refuse): the adapters' structure against the FP32 oracle (bf16_served_checks), a wrong adapter
failing it, what they refuse, and that the model's dispatch serves them from the gemm family."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Unsupported, get_family, get_impl
from dsv4bench.model.dispatch import ORACLE_ONLY
from kernels.gemm import bf16_serves, serves
from kernels.gemm.bf16_glue import bf16_oracle
from oracles.linear import QuantWeight
from tests.gemm import bf16_served_checks as bc
from tests.gemm.test_serves_cpu import emulated

OPS = ("lm_head", "compressor_project", "indexer_weights")


def emulated_gemm(params: dict, inputs: dict) -> dict:
    """The bf16 GEMM as the kernel computes it (up to summation order): fp32 out."""
    reason = get_impl("gemm", "cutedsl").supports(Case("gemm", params), "sm_90a")
    if reason:
        raise Unsupported(reason)
    assert params["op"] == "bf16" and inputs["x"].dtype == inputs["w"].dtype == torch.bfloat16
    assert inputs["x"].is_contiguous() and inputs["w"].is_contiguous()
    assert (params["m"], params["k"]) == inputs["x"].shape and (params["n"], params["k"]) == inputs["w"].shape
    return {"out": bf16_oracle(inputs["x"], inputs["w"])}


@pytest.fixture
def run(monkeypatch):
    monkeypatch.setattr(serves, "kernel_runner", emulated)  # mhc, rmsnorm: their families' references
    return emulated_gemm


def test_the_gemm_family_serves_them_and_they_are_off_the_oracle_only_list():
    assert set(OPS) <= set(get_family("gemm").serves) and not set(OPS) & set(ORACLE_ONLY)
    assert all(get_family("gemm").serves[op] is bf16_serves.OPS[op] for op in OPS)


@pytest.mark.parametrize("tokens", [1, 7, 130])
def test_lm_head(tokens, run):
    args = bc.op_args("lm_head", bc.SMALL, tokens, seed=tokens, device="cpu")
    out = bf16_serves.lm_head(run, *args)
    assert out.shape == (tokens, bc.SMALL.vocab)
    bc.assert_passes("lm_head", out, args)


def test_lm_head_keeps_the_leading_dims(run):
    x, *rest = bc.op_args("lm_head", bc.SMALL, 6, seed=3, device="cpu")
    out = bf16_serves.lm_head(run, x.unflatten(0, (2, 3)), *rest)
    assert out.shape == (2, 3, bc.SMALL.vocab)
    torch.testing.assert_close(out.flatten(0, 1), bf16_serves.lm_head(run, x, *rest))


@pytest.mark.parametrize("compressor", sorted(bc.COMPRESSORS))
@pytest.mark.parametrize("tokens,start", [(1, 77), (9, 0), (300, 0)])
def test_compressor_project(compressor, tokens, start, run):
    args = bc.op_args("compressor_project", bc.SMALL, tokens, seed=tokens, device="cpu", compressor=compressor,
                      start=start)
    out = bf16_serves.compressor_project(run, *args)
    bc.assert_passes("compressor_project", out, args)
    bc.assert_summation_order_close("compressor_project", out, args)


def test_compressor_project_with_shifted_positions_fails(run):
    x, wkv, wgate, ape, pos = bc.op_args("compressor_project", bc.SMALL, 16, seed=1, device="cpu")
    out = bf16_serves.compressor_project(run, x, wkv, wgate, ape, pos + 1)
    with pytest.raises(AssertionError):
        bc.assert_summation_order_close("compressor_project", out, (x, wkv, wgate, ape, pos))


@pytest.mark.parametrize("tokens", [1, 65, 257])
def test_indexer_weights(tokens, run):
    args = bc.op_args("indexer_weights", bc.SMALL, tokens, seed=tokens, device="cpu")
    out = bf16_serves.indexer_weights(run, *args)
    assert out.shape == (tokens, bc.INDEX_HEADS)
    bc.assert_passes("indexer_weights", out, args)
    bc.assert_summation_order_close("indexer_weights", out, args)


def test_a_weight_in_another_dtype_is_cast_once(run):
    x, w, hd = bc.op_args("indexer_weights", bc.SMALL, 5, seed=2, device="cpu")
    w32 = w.float()
    torch.testing.assert_close(bf16_serves.indexer_weights(run, x, w32, hd), bf16_serves.indexer_weights(run, x, w, hd))
    assert bf16_serves.bf16_weight(w32) is bf16_serves.bf16_weight(w32)  # made once
    assert bf16_serves.bf16_weight(w) is w  # a bf16 weight goes as it is


def test_what_the_adapters_refuse(run):
    args = bc.op_args("lm_head", bc.SMALL, 2, seed=1, device="cpu")
    with pytest.raises(Unsupported, match="eps"):
        bf16_serves.lm_head(run, *args, eps=1e-5)
    x, w, hd = bc.op_args("indexer_weights", bc.SMALL, 2, seed=1, device="cpu")
    fp8 = QuantWeight(w.to(torch.float8_e4m3fn), torch.ones(1, 2))
    with pytest.raises(Unsupported, match="bf16 weights"):
        bf16_serves.indexer_weights(run, x, fp8, hd)
    odd = torch.randn(3, 100)
    with pytest.raises(Unsupported, match="multiple of 8"):
        bf16_serves.indexer_weights(run, odd, torch.randn(64, 100).bfloat16(), hd)
