"""Activation quantisation in CuTeDSL: bf16 → FP8 e4m3 or MXFP4 e2m1 codes + ue8m0 scales (spec §2.3-§2.5).

Formats (one kernel, compile-time switches):
- fp8:   per `block` (128 for GEMM inputs, 64 for the KV cache) s = 2^ceil(log2(max(amax,1e-4)/448)),
         code = e4m3_RNE(clamp(x/s, ±448)); one uint8 code per element.
- mxfp4: per 32, s = 2^ceil(log2(max(amax, 6·2^-126)/6)), code = e2m1_RNE(clamp(x/s, ±6)); two codes
         per byte, element 2k in the low nibble. With `rotate`, each 128-wide row is first turned
         into bf16(H_128·x·128^-0.5) (the indexer's `rotate_activation`).
Scales: one per block, as the scale tensor's element type asks (fixed when the kernel is traced):
ue8m0 bytes (Uint8, the biased exponent e; the family's output) or fp32 values 2^(e − 127) (Float32,
what the FP8 GEMM reads, kernels/gemm/quant_gemm.py). The scale tensor may have any strides, so a
caller can have them written straight into its own layout (the GEMM's MN-major columns).

One source for sm_90a and sm_100a: 128-bit loads, warp shuffles and `cvt...e4m3x2` (sm_89+).

Layout of the work (memory-bound: read x once, write codes + scales once):
- A thread owns 16-byte vectors of 8 elements; thread t of a row holds vectors t, t + T, ...
  (T = threads per row), so consecutive threads read consecutive vectors.
- T is a multiple of block/8, so the block/8 lanes that share a block sit in one aligned shuffle
  group; the block amax is a butterfly max over that group. Blocks never straddle a row.
- The Hadamard rotation (mxfp4, n = 128) has its own layout and kernel: kernels/quant/rotate.py.
- Rows are a runtime size and may have a row stride > n (a column slice such as kv[:, :448]).
- A row wider than one CTA takes (256 threads x 8 vectors = 16384 elements: the grouped wo_a input,
  G x 4096 wide) is split into `col_tiles` equal column tiles, one CTA each (grid y); tile widths are
  whole blocks, so no block straddles two CTAs. Every narrower row is one tile (grid y = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8

from kernels.bits import bits_f32
from kernels.quant.numerics import (
    cute_abs, e2m1_code, e4m3x2, inv_pow2, ue8m0_exponent,
)
from kernels.quant.rotate import FP4_AMAX_FLOOR, FP4_MAX, HADAMARD_N, VEC, HadamardMxfp4

MAX_VECS_PER_THREAD = 8
MAX_THREADS_PER_ROW = 256
CTA_THREADS = 256
FORMATS = {"fp8": (448.0, 1e-4), "mxfp4": (FP4_MAX, FP4_AMAX_FLOOR)}  # qmax, amax floor


@dataclass(frozen=True)
class QuantConfig:
    fmt: str
    n: int
    block: int
    rotate: bool
    threads_per_row: int
    vecs_per_thread: int
    rows_per_cta: int
    col_tiles: int = 1

    @classmethod
    def make(cls, fmt: str, n: int, block: int, rotate: bool = False) -> "QuantConfig":
        if fmt not in FORMATS:
            raise ValueError(f"unknown quant format {fmt!r}")
        if block % VEC or block < VEC or block & (block - 1):
            raise ValueError(f"block {block} must be a power of two >= {VEC}")
        if block // VEC > 32:
            raise ValueError(f"block {block} spans more than a warp")
        if n <= 0 or n % block:
            raise ValueError(f"width {n} is not a positive multiple of block {block}")
        if fmt == "mxfp4" and block != 32:
            raise ValueError("mxfp4 uses 32-element blocks")
        if rotate and (fmt != "mxfp4" or n != HADAMARD_N):
            raise ValueError(f"the Hadamard rotation is the indexer's: mxfp4 with n = {HADAMARD_N}")
        n_vecs = n // VEC
        threads = block // VEC  # (the rotation has its own 2-lanes-per-row layout, kernels/quant/rotate.py)
        while threads < MAX_THREADS_PER_ROW and -(-n_vecs // threads) > MAX_VECS_PER_THREAD:
            threads *= 2
        col_tiles = -(-n_vecs // (threads * MAX_VECS_PER_THREAD))  # > 1 only at threads = 256
        vecs = -(-n_vecs // (threads * col_tiles))
        return cls(fmt, n, block, rotate, threads, vecs, max(1, CTA_THREADS // threads), col_tiles)

    @property
    def lanes_per_block(self) -> int:
        return self.block // VEC

    @property
    def code_vec(self) -> int:
        """Bytes of codes per input vector: 8 (fp8) or 4 (two e2m1 per byte)."""
        return VEC if self.fmt == "fp8" else VEC // 2

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    def tiler(self, vec: int) -> tuple[int, int]:
        """A CTA's tile: rows_per_cta rows, vecs_per_thread passes of one vector per thread (one of the
        row's col_tiles column tiles)."""
        return self.rows_per_cta, vec * self.threads_per_row * self.vecs_per_thread

    def copy_tiler(self, vec: int) -> tuple[int, int]:
        """One pass: every thread moves one vector."""
        return self.rows_per_cta, vec * self.threads_per_row

    def tv_layout(self, vec: int):
        """(thread, value) → (row, col) in a column-major copy tile; thread = t + T·row."""
        r, t = self.rows_per_cta, self.threads_per_row
        return cute.make_layout(((t, r), vec), stride=((vec * r, 1), r))


class QuantKernel(HadamardMxfp4):
    """Compile-time: format, width, block, rotation. Runtime: rows and the input's row stride.

    The rotate path runs `HadamardMxfp4.kernel_rotate` (v4, kernels/quant/rotate.py); `kernel` serves
    every other format. Earlier rotate paths are in git history; their figures are told in
    docs/perf/quant.md (runs listed in benchmarks/results/INDEX.md).
    """

    def __init__(self, fmt: str, n: int, block: int, rotate: bool = False, trigger: bool = False):
        self.cfg = QuantConfig.make(fmt, n, block, rotate)
        self.trigger = trigger  # let a dependent grid launched with PDL start now (it waits for this one's end)

    def e2m1(self, v: Float32) -> Int32:
        return e2m1_code(v)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        cfg = self.cfg
        check_scale_type(cfg, mS.element_type)
        if cutlass.const_expr(cfg.rotate):
            self.launch_rotate(mX, mQ, mS, stream)
        else:
            self.kernel(mX, mQ, mS).launch(
                grid=[cute.ceil_div(mX.shape[0], cfg.rows_per_cta), cfg.col_tiles, 1], block=[cfg.threads, 1, 1],
                stream=stream,
            )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        lane_in_row = tidx % cfg.threads_per_row
        tile = (bidx, bidy) if cfg.col_tiles > 1 else (bidx, 0)  # (row block, column tile)
        if cutlass.const_expr(self.trigger):
            cute.arch.griddepcontrol_launch_dependents()

        x_tiler, q_tiler = cfg.tiler(VEC), cfg.tiler(cfg.code_vec)
        x_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=VEC * 16)
        q_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint8, num_bits_per_copy=cfg.code_vec * 8)
        x_copy = cute.make_tiled_copy(x_atom, cfg.tv_layout(VEC), cfg.copy_tiler(VEC)).get_slice(tidx)
        q_copy = cute.make_tiled_copy(q_atom, cfg.tv_layout(cfg.code_vec), cfg.copy_tiler(cfg.code_vec)).get_slice(tidx)
        tXgX = x_copy.partition_S(cute.local_tile(mX, x_tiler, tile))
        tXcX = x_copy.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), x_tiler, tile))
        tQgQ = q_copy.partition_D(cute.local_tile(mQ, q_tiler, tile))

        row = tXcX[0][0]
        row_ok = row < mX.shape[0]
        tXrX = cute.make_fragment_like(tXgX)
        tXrX.fill(0)
        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            if row_ok and tXcX[(0, 0), 0, j][1] < cfg.n:
                cute.copy(x_atom, tXgX[None, None, j], tXrX[None, None, j])
        x = cute.make_fragment_like(tXrX, Float32)
        x.store(tXrX.load().to(Float32))

        qmax, floor = FORMATS[cfg.fmt]
        tQrQ = cute.make_fragment_like(tQgQ)
        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            amax = cute_abs(x[VEC * j])
            for e in cutlass.range_constexpr(1, VEC):
                amax = cute.arch.fmax(amax, cute_abs(x[VEC * j + e]))
            amax = cute.arch.warp_reduction_max(amax, threads_in_group=cfg.lanes_per_block)
            exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(floor)), 1.0 / qmax)
            inv_s = inv_pow2(exp)
            col = tXcX[(0, 0), 0, j][1]
            if row_ok and col < cfg.n and lane_in_row % cfg.lanes_per_block == 0:
                mS[row, col // cfg.block] = scale_value(exp, mS.element_type)
            for k in cutlass.range_constexpr(VEC // 2):
                lo, hi = x[VEC * j + 2 * k] * inv_s, x[VEC * j + 2 * k + 1] * inv_s
                if cutlass.const_expr(cfg.fmt == "fp8"):
                    pair = e4m3x2(lo, hi)
                    tQrQ[VEC * j + 2 * k] = Uint8(pair & 0xFF)
                    tQrQ[VEC * j + 2 * k + 1] = Uint8(pair >> 8)
                else:
                    tQrQ[cfg.code_vec * j + k] = Uint8(self.e2m1(lo) | (self.e2m1(hi) << 4))

        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            if row_ok and tXcX[(0, 0), 0, j][1] < cfg.n:
                cute.copy(q_atom, tQrQ[None, None, j], tQgQ[None, None, j])


SCALE_TYPES = (Uint8, Float32)


def check_scale_type(cfg: QuantConfig, dtype) -> None:
    """Trace-time check of the scale tensor's element type (see the module docstring)."""
    if dtype not in SCALE_TYPES:
        raise ValueError(f"quant: the scale tensor must be Uint8 (ue8m0) or Float32, got {dtype}")
    if cfg.rotate and dtype != Uint8:
        raise ValueError("quant: the rotate path writes ue8m0 (Uint8) scales only")


def scale_value(exp: Int32, dtype):
    """The stored scale of biased exponent `exp`: its ue8m0 byte, or the fp32 value 2^(exp − 127)."""
    return bits_f32(exp << 23) if dtype == Float32 else Uint8(exp)
