"""RMSNorm in CuTeDSL: y = cast(w * (x * rsqrt(mean(x^2) + eps))) over the last dim (spec §2.1).

One source for sm_90a and sm_100a: only 128-bit global loads/stores, warp shuffles and a tiny
shared-memory exchange, nothing arch-specific.

Design (memory-bound: read x once, write y once):
- A row lives in registers. `threads_per_row` threads split a row into 16-byte vectors; thread t
  holds vectors t, t + T, t + 2T, ... (coalesced: consecutive threads read consecutive vectors).
- Narrow rows pack several rows per CTA so every CTA has >= 128 threads.
- The row's sum of squares is reduced inside the thread, then across the row's lanes with warp
  shuffles, then (rows wider than one warp) across its warps through shared memory.
- Ragged M and widths that are not a multiple of the tile are predicated per vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
from cutlass import Float32

from dsv4bench.compile.recorder import record, record_slice

COPY_BITS = 128
MAX_VECS_PER_THREAD = 8  # registers per thread stay small; more threads per row beyond that
MIN_CTA_THREADS = 128
MAX_THREADS_PER_ROW = 1024


@dataclass(frozen=True)
class RmsNormConfig:
    n: int
    vec: int  # elements per 16-byte vector
    threads_per_row: int
    rows_per_cta: int
    vecs_per_thread: int

    @classmethod
    def for_width(cls, n: int, dtype_width: int) -> "RmsNormConfig":
        if n <= 0:
            raise ValueError(f"rmsnorm width must be positive, got {n}")
        vec = COPY_BITS // dtype_width
        while n % vec:  # odd widths fall back to narrower (still aligned) vectors
            vec //= 2
        n_vecs = n // vec
        threads = 1
        while threads < MAX_THREADS_PER_ROW and -(-n_vecs // threads) > MAX_VECS_PER_THREAD:
            threads *= 2
        threads = max(threads, min(32, 1 << (n_vecs - 1).bit_length()))
        vecs_per_thread = -(-n_vecs // threads)
        if vecs_per_thread > 4 * MAX_VECS_PER_THREAD:
            raise ValueError(f"rmsnorm width {n} is too wide for one CTA per row")
        rows = max(1, MIN_CTA_THREADS // threads)
        return cls(n, vec, threads, rows, vecs_per_thread)

    @property
    def cols_per_tile(self) -> int:
        return self.vec * self.threads_per_row * self.vecs_per_thread

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // 32)

    def tv_layout(self):
        """(thread, value) -> (row, col) in a (rows_per_cta, cols_per_tile) tile, column-major."""
        r, t, v = self.rows_per_cta, self.threads_per_row, self.vec
        shape = ((t, r), (v, self.vecs_per_thread))
        stride = ((v * r, 1), (r, r * v * t))
        return shape, stride


def vector(t, j: int, stage: str):
    """Vector j of a thread's copy partition ((vec, V), 1, 1); the slice is bounds-checked while
    layouts are recorded (lint slice-bounds: indexing j in mode 2 compiled and ran silently)."""
    return record_slice(stage, t, ((None, j), None, None))


class RmsNormKernel:
    """Compile-time parameters: dtype, width, weight present, eps. Rows are a runtime size."""

    def __init__(self, dtype: type, n: int, has_weight: bool, eps: float = 1e-6):
        self.dtype = dtype
        self.cfg = RmsNormConfig.for_width(n, dtype.width)
        self.has_weight = has_weight
        self.eps = eps

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        cfg = self.cfg
        self.kernel(mX, mW, mO).launch(
            grid=[cute.ceil_div(mX.shape[0], cfg.rows_per_cta), 1, 1],
            block=[cfg.threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        cfg = self.cfg
        shape, stride = cfg.tv_layout()
        tv_layout = cute.make_layout(shape, stride=stride)
        tiler = (cfg.rows_per_cta, cfg.cols_per_tile)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_rows = mX.shape[0]

        smem = utils.SmemAllocator()
        partials = smem.allocate_tensor(
            Float32, cute.make_layout((cfg.rows_per_cta, cfg.warps_per_row)), byte_alignment=4
        )

        gX = cute.local_tile(mX, tiler, (bidx, 0))
        gO = cute.local_tile(mO, tiler, (bidx, 0))
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), tiler, (bidx, 0))

        atom = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=cfg.vec * mX.element_type.width
        )
        tiled_copy = cute.make_tiled_copy(atom, tv_layout, tiler)
        thr_copy = tiled_copy.get_slice(tidx)
        tXgX = thr_copy.partition_S(gX)
        tXgO = thr_copy.partition_D(gO)
        tXcX = thr_copy.partition_S(cX)
        record("TV layout (thread, value) -> (row, col)", tv_layout)
        record("x tile (gX)", gX)
        record("tiled copy", tiled_copy)
        record("x per thread (tXgX)", tXgX)
        record("smem partials", partials)

        # The partition is ((vec, vecs_per_thread), 1, 1): vector j is mode-0 coordinate (None, j).
        # (Indexing j in mode 2, a size-1 stride-0 mode, silently copies the whole fragment and
        # predicates on vector 0: full-width rows pass, ragged rows write past their end.)
        row = tXcX[0][0]
        row_ok = row < n_rows
        tXrX = cute.make_fragment_like(tXgX)
        tXrX.fill(0)
        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            if row_ok and tXcX[(0, j), 0, 0][1] < cfg.n:
                cute.copy(atom, vector(tXgX, j, "x vector (global)"), vector(tXrX, j, "x vector (registers)"))

        x = tXrX.load().to(Float32)
        sum_sq = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        sum_sq = cute.arch.warp_reduction_sum(sum_sq, threads_in_group=min(cfg.threads_per_row, 32))
        if cutlass.const_expr(cfg.warps_per_row > 1):
            lane = tidx % 32
            row_in_cta = tidx // cfg.threads_per_row
            warp_in_row = (tidx % cfg.threads_per_row) // 32
            if lane == 0:
                partials[row_in_cta, warp_in_row] = sum_sq
            cute.arch.barrier()
            sum_sq = Float32(0.0)
            for w in cutlass.range_constexpr(cfg.warps_per_row):
                sum_sq += partials[row_in_cta, w]

        rstd = cute.math.rsqrt(sum_sq / cfg.n + self.eps)
        y = x * rstd
        if cutlass.const_expr(self.has_weight):
            # The weight is the same for every row: a (rows, n) view with row stride 0.
            w_rows = cute.make_tensor(
                mW.iterator, cute.prepend(mW.layout, cute.make_layout((cfg.rows_per_cta,), stride=(0,)))
            )
            tXgW = thr_copy.partition_S(cute.local_tile(w_rows, tiler, (0, 0)))
            tXrW = cute.make_fragment_like(tXgW)
            tXrW.fill(0)
            for j in cutlass.range_constexpr(cfg.vecs_per_thread):
                if tXcX[(0, j), 0, 0][1] < cfg.n:
                    cute.copy(atom, vector(tXgW, j, "w vector (global)"), vector(tXrW, j, "w vector (registers)"))
            y = y * tXrW.load().to(Float32)

        tXrO = cute.make_fragment_like(tXgO)
        tXrO.store(y.to(mO.element_type))
        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            if row_ok and tXcX[(0, j), 0, 0][1] < cfg.n:
                cute.copy(atom, vector(tXrO, j, "y vector (registers)"), vector(tXgO, j, "y vector (global)"))
