"""The gemm family's model ops (kernels/gemm/serves.py) on the CPU, each kernel emulated by its
family's own torch reference and refusing what the kernel's `supports` refuses (as KernelOp does):
the adapters' structure (shapes, group order, positions, QAT, the weights) against the FP32 oracle
by the FP8 rule of served_checks, a wrong adapter failing it, and what they refuse."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Unsupported, get_family, get_impl
from dsv4bench.model.dispatch import ORACLE_ONLY
from kernels.gemm import bf16_serves, serves
from kernels.rope.family import rope_eager
from oracles.linear import QuantWeight, dequant
from oracles.quant import dequant_fp8_weight, quant_fp4_weight
from tests.gemm import served_checks as sc

OPS = sorted(sc.LOWPREC)  # the projections; indexer_queries and mtp_input: tests/model/test_served_ops_*.py


def emulated(family: str):
    """A `run(params, inputs)` that computes the family's torch reference of the case."""
    fam, impl = get_family(family), get_impl(family, "cutedsl")

    def run(params: dict, inputs: dict) -> dict:
        case = Case(family, params)
        reason = impl.supports(case, "sm_90a")
        if reason:
            raise Unsupported(reason)
        if family == "rope":  # the family's reference rotates by its own table; the op passes the rows
            op = params["op"]
            return {"out": rope_eager(inputs["x"], inputs["positions"], inputs["table"], op == "q_norm_rope",
                                      op == "inverse")}
        return fam.lowprec(case, inputs)

    return run


@pytest.fixture
def kernels(monkeypatch):
    """The adapters' other kernels emulated; returns the gemm family's `run`."""
    monkeypatch.setattr(serves, "kernel_runner", emulated)
    return emulated("gemm")


def test_served_ops_are_off_the_oracle_only_list():
    assert set(serves.OPS) | set(bf16_serves.OPS) == set(get_family("gemm").serves)
    assert not set(get_family("gemm").serves) & set(ORACLE_ONLY)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("tokens,decode", [(1, True), (37, False), (300, True)])
def test_adapter_passes_the_fp8_rule(op, tokens, decode, kernels):
    args, kwargs = sc.op_args(op, sc.SMALL, tokens, seed=tokens, device="cpu", decode=decode)
    sc.assert_passes(op, serves.OPS[op](kernels, *args, **kwargs), args, kwargs)


def test_kv_projection_without_qat(kernels):
    args, kwargs = sc.op_args("kv_projection", sc.SMALL, 19, seed=2, device="cpu", qat=False)
    sc.assert_passes("kv_projection", serves.OPS["kv_projection"](kernels, *args, **kwargs), args, kwargs)


def test_a_wrong_group_order_fails_the_rule(kernels):
    """The rule is not vacuous: wo_a's groups taken in reverse order fail it."""
    args, kwargs = sc.op_args("output_projection", sc.SMALL, 37, seed=5, device="cpu")
    wo_a = args[3]
    flipped = QuantWeight(wo_a.weight.unflatten(0, (2, -1)).flip(0).flatten(0, 1), wo_a.scale.flip(0))
    out = serves.output_projection(kernels, *args[:3], flipped, *args[4:])
    assert not all(sc.passes(row) for row in sc.errors("output_projection", out, args, kwargs))


def test_leading_dims_come_back_as_the_oracle_shapes(kernels):
    args, _ = sc.op_args("q_projection", sc.SMALL, 6, seed=3, device="cpu")
    x, positions = args[0].view(2, 3, -1), args[5].view(2, 3)
    q, qr = serves.q_projection(kernels, x, *args[1:5], positions, *args[6:])
    assert q.shape == (2, 3, sc.SMALL.heads, sc.HEAD_DIM) and qr.shape == (2, 3, sc.SMALL.q_lora)
    assert q.dtype == qr.dtype == torch.float32


def test_weights_are_prepared_once_and_a_dequantised_weight_is_the_same_fp8_weight():
    qw = sc._weight(256, 384, torch.Generator().manual_seed(0), "cpu")
    codes, scales = serves.fp8_weight(qw)
    assert codes is qw.weight and scales.dtype == torch.float32 and serves.fp8_weight(qw)[1] is scales
    plain = dequant(qw)
    again = serves.fp8_weight(plain)
    assert serves.fp8_weight(plain)[1] is again[1]
    assert torch.equal(dequant_fp8_weight(*again), plain)  # re-quantising an FP8 weight is exact


def test_what_the_kernels_do_not_take_is_unsupported(kernels):
    tiny = sc.Dims(dim=64, q_lora=64, heads=4, groups=2, o_lora=32)  # the tiny config's widths
    for op in OPS:  # the FP8 linears' K of 64, wo_a's groups of 32 rows (the bf16 GEMM's tiles are 64)
        args, kwargs = sc.op_args(op, tiny, 3, seed=1, device="cpu")
        why = "whole tiles a group" if op == "output_projection" else "multiple of 128"
        with pytest.raises(Unsupported, match=why):
            serves.OPS[op](kernels, *args, **kwargs)
    args, _ = sc.op_args("kv_projection", sc.SMALL, 3, seed=1, device="cpu")
    with pytest.raises(Unsupported, match="FP8 weights, not mxfp4"):
        serves.kv_projection(kernels, args[0], QuantWeight(*quant_fp4_weight(torch.randn(512, 256))), *args[2:])
    with pytest.raises(Unsupported, match="eps"):
        serves.kv_projection(kernels, *args[:5], eps=1e-5)
