"""The gemm family's model ops on the kernels (the H100): each against its FP32 oracle by the FP8 rule
of served_checks (within 2x the error of the op's low-precision reference), on fresh random inputs
at non-square, ragged token counts (one decode row up to multi-tile prefills), at a small width and
at the Flash and Pro widths; a dequantised weight gives the same output as its FP8 checkpoint form."""

from __future__ import annotations

import functools

import pytest
import torch

from dsv4bench.core.registry import Unsupported
from dsv4bench.model.kernel_ops import served_ops
from oracles.linear import QuantWeight, dequant
from tests.gemm import served_checks as sc

pytestmark = pytest.mark.gpu

OPS = sorted(sc.LOWPREC)  # the projections; indexer_queries and mtp_input: tests/model/test_served_ops_*.py


@functools.cache
def _served(op: str):
    return served_ops()[op]  # the KernelOp the model registers (its compile cache kept across tests)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("tokens,decode", [(1, True), (7, True), (130, False), (1000, False), (4097, False)])
def test_small_width(op, tokens, decode):
    args, kwargs = sc.op_args(op, sc.SMALL, tokens, seed=tokens, device="cuda", decode=decode)
    sc.assert_passes(op, _served(op)(*args, **kwargs), args, kwargs)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dims,tokens", [(sc.FLASH, 5), (sc.FLASH, 301), (sc.PRO, 3), (sc.PRO, 129)],
                         ids=["flash-5", "flash-301", "pro-3", "pro-129"])
def test_model_widths(op, dims, tokens):
    args, kwargs = sc.op_args(op, dims, tokens, seed=tokens + 1, device="cuda", decode=tokens < 16)
    sc.assert_passes(op, _served(op)(*args, **kwargs), args, kwargs)


def test_kv_projection_without_qat():
    args, kwargs = sc.op_args("kv_projection", sc.SMALL, 33, seed=4, device="cuda", qat=False)
    sc.assert_passes("kv_projection", _served("kv_projection")(*args, **kwargs), args, kwargs)


@pytest.mark.parametrize("op", OPS)
def test_a_dequantised_weight_gives_the_same_output(op):
    args, kwargs = sc.op_args(op, sc.SMALL, 65, seed=8, device="cuda")
    plain = tuple(dequant(a) if isinstance(a, QuantWeight) else a for a in args)
    for a, b in zip(sc.as_tuple(_served(op)(*args, **kwargs)), sc.as_tuple(_served(op)(*plain, **kwargs))):
        assert torch.equal(a, b)


def test_the_tiny_widths_are_unsupported_not_wrong():
    tiny = sc.Dims(dim=64, q_lora=64, heads=4, groups=2, o_lora=32)
    for op in OPS:  # the FP8 linears' K of 64, wo_a's groups of 32 rows (the bf16 GEMM's tiles are 64)
        args, kwargs = sc.op_args(op, tiny, 3, seed=1, device="cuda")
        why = "whole tiles a group" if op == "output_projection" else "multiple of 128"
        with pytest.raises(Unsupported, match=why):
            _served(op)(*args, **kwargs)
