"""An op table whose candidate ops run their FP32 oracle beside them on the same inputs.

At every call of an op not on the oracle, `ShadowTable` first runs the op's oracle on the same
arguments (a private copy of a compressor state, which the op updates), then the candidate, whose
output the model goes on with. Per (scope, op) it accumulates the candidate's *local* error — against
the oracle on identical inputs, so upstream drift and top-k flips elsewhere do not count — and the
floor one bf16 rounding of the oracle's output would cost (dsv4bench/model/error.py).
"""

from __future__ import annotations

import copy

import torch

from dsv4bench.model.dispatch import OPS, ORACLE, OpTable
from dsv4bench.model.error import Error
from oracles.compressor import CompressorState


def _private(arg):
    return copy.deepcopy(arg) if isinstance(arg, CompressorState) else arg


def bf16_outputs(out):
    """Floating tensors (in tuples too) rounded to bf16 and back; everything else unchanged."""
    if isinstance(out, tuple):
        return tuple(bf16_outputs(o) for o in out)
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.bfloat16().to(out.dtype)
    return out


class ShadowTable(OpTable):
    def __init__(self, selection):
        super().__init__(selection)
        self.local: dict[tuple[str, str], Error] = {}
        self.floor: dict[tuple[str, str], Error] = {}

    def __getattr__(self, op: str):
        call = super().__getattr__(op)
        if self.active[op] == ORACLE:
            return call

        def shadowed(*args, **kwargs):
            ref = OPS[op].oracle(*map(_private, args), **kwargs)
            out = call(*args, **kwargs)
            key = (self.scope, op)
            self.local.setdefault(key, Error()).add(out, ref)
            self.floor.setdefault(key, Error()).add(bf16_outputs(ref), ref)
            return out

        return shadowed

    def op_errors(self, op: str) -> tuple[Error, Error]:
        """(local error, bf16 floor) of `op` over every scope."""
        local, floor = Error(), Error()
        for key, err in self.local.items():
            if key[1] == op:
                local.merge(err)
                floor.merge(self.floor[key])
        return local, floor
