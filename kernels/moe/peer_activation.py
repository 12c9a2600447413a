"""The `deepgemm-kernels` peer's activation between its two DeepGEMM GEMMs, as a serving stack runs it: one Triton
kernel (SGLang's and vLLM's DeepGEMM paths fuse SiLU-and-mul with the FP8 quantisation the same way) that reads L1's
bf16 output once and writes h's e4m3 codes and scales in DeepGEMM's layout. Masked: a program whose row block lies
past its expert's count returns at once, so a decode step touches only the routed rows.

It replaced a torch.compile'd composition (`peers.swiglu_quant`, still the eager `deepgemm` peer's) that took
~450 us a call at every decode size (H200, Flash; ~1000 us Pro; it ran over max_m rows of every expert, routed or
not, in three inductor kernels), which had made the peer look 3-7x slower than it is.

Math: `peers.swiglu_quant` (route weight x silu(min(g, 10)) x clamp(u, +-10), 0 on padding rows; per 128 columns
amax (floor 1e-4) -> 2^ceil(log2(amax / 448)), codes RNE to e4m3). silu's exp is Triton's: a code may differ from
torch's by one e4m3 step where the product falls on a rounding tie (tests/moe/test_moe_peer_kernels_gpu.py bounds it).
"""

from __future__ import annotations

import functools

import torch

from oracles.moe import SWIGLU_LIMIT
from oracles.quant import FP8_AMAX_FLOOR, FP8_E4M3_MAX

BLOCK = 128  # h's quantisation block (one program's columns)
ROWS = 16  # rows a program


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def swiglu_quant_kernel(gate_up, row_weight, src, counts, h, h_scales, rows_per_group, inter, scale_group_stride,
                            scale_block_stride, MASKED: tl.constexpr, R: tl.constexpr, B: tl.constexpr,
                            LIMIT: tl.constexpr, AMAX_FLOOR: tl.constexpr, QMAX: tl.constexpr, INV_QMAX: tl.constexpr):
        group, row_block, col_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = row_block * R + tl.arange(0, R)
        if MASKED:  # rows < the expert's count are real (the masked dispatch leaves no holes)
            count = tl.load(counts + group)
            if row_block * R >= count:
                return
            valid = rows < count
            store = valid
        else:  # contiguous: padding rows (src < 0) become zeros, as DeepGEMM reads their whole 128-row blocks
            store = rows < rows_per_group
            valid = store & (tl.load(src + rows, mask=store, other=-1) >= 0)
        line = group.to(tl.int64) * rows_per_group + rows
        cols = col_block * B + tl.arange(0, B)
        at = line[:, None] * (2 * inter) + cols[None, :]
        gate = tl.load(gate_up + at, mask=valid[:, None], other=0.0).to(tl.float32)
        up = tl.load(gate_up + at + inter, mask=valid[:, None], other=0.0).to(tl.float32)
        weight = tl.load(row_weight + line, mask=valid, other=0.0)
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        act = gate / (1.0 + tl.exp(-gate)) * up * weight[:, None]
        act = tl.where(valid[:, None], act, 0.0)
        amax = tl.maximum(tl.max(tl.abs(act), axis=1), AMAX_FLOOR)
        bits = (amax * INV_QMAX).to(tl.int32, bitcast=True)  # rounded up to a power of two from the IEEE bits
        exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (exponent << 23).to(tl.float32, bitcast=True)
        codes = tl.minimum(tl.maximum(act / scale[:, None], -QMAX), QMAX).to(tl.float8e4nv)
        tl.store(h + line[:, None] * inter + cols[None, :], codes, mask=store[:, None])
        tl.store(h_scales + group * scale_group_stride + col_block * scale_block_stride + rows, scale, mask=store)

    return swiglu_quant_kernel


INV_QMAX = float(torch.tensor(1.0 / FP8_E4M3_MAX, dtype=torch.float32))  # fp32(1/448), as ue8m0_scale multiplies


def swiglu_quant_into(gate_up: torch.Tensor, row_weight: torch.Tensor, src: torch.Tensor, h: torch.Tensor,
                      h_scales: torch.Tensor, counts: torch.Tensor | None = None, used: int | None = None) -> None:
    """L1's bf16 [rows, 2I] (gate columns, then up) -> h codes (uint8 e4m3 bits [rows, I]) and fp32 scales.
    Contiguous (counts None): every row, scales [I/128, rows]. Masked: counts [E] (int32), rows = E x m, scales
    [E, I/128, m]; only each expert's first min(count, used) rows are written (used: a bound no count passes)."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if inter % BLOCK or h.shape != (rows, inter) or not (gate_up.is_contiguous() and h.is_contiguous()):
        raise ValueError(f"gate_up [rows, 2I] and h [rows, I] contiguous with I % {BLOCK} == 0: got "
                         f"{tuple(gate_up.shape)}, {tuple(h.shape)}")
    groups = 1 if counts is None else counts.numel()
    m = rows // groups
    grid = (groups, -(-(m if used is None else used) // ROWS), inter // BLOCK)
    group_stride = 0 if counts is None else h_scales.stride(0)
    _kernel()[grid](gate_up, row_weight, src, counts if counts is not None else src,
                       h.view(torch.float8_e4m3fn), h_scales, m, inter, group_stride, h_scales.stride(-2),
                       MASKED=counts is not None, R=ROWS, B=BLOCK, LIMIT=float(SWIGLU_LIMIT),
                       AMAX_FLOOR=float(FP8_AMAX_FLOOR), QMAX=float(FP8_E4M3_MAX), INV_QMAX=INV_QMAX, num_warps=4)
