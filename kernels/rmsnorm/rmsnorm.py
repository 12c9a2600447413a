"""RMSNorm in CuTeDSL: y = cast(w * (x * rsqrt(mean(x^2) + eps))) over the last dim (spec §2.1).

One source for sm_90a and sm_100a: only 128-bit global loads/stores, warp shuffles and a tiny
shared-memory exchange, nothing arch-specific.

Design (memory-bound: x from HBM once, y written once):
- A row lives in registers (wide rows by default read it a second time from L1/L2 after the
  reduction instead; see `reload_hint`). `threads_per_row` threads split a row into 16-byte vectors; thread t
  holds vectors t, t + T, t + 2T, ... (coalesced: consecutive threads read consecutive vectors).
- Narrow rows pack several rows per CTA so every CTA has >= 128 threads.
- The row's sum of squares is reduced inside the thread, then across the row's lanes with warp
  shuffles, then (rows wider than one warp) across its warps through shared memory.
- Ragged M and widths that are not a multiple of the tile are predicated per vector.

Compile-time tuning knobs (RmsNormConfig; the defaults are v3 = v2 + `w_early`, the fastest measured;
rows of >= TWO_PASS_MIN_VECS vectors given no knobs take v4, Inductor's two-pass schedule):
- `load_hint` / `store_hint`: cache hints on the x loads and y stores (LOAD_HINTS, STORE_HINTS:
  L1 no-allocate / evict-first, `.cs` streaming, `.nc` read-only path, L2 evict-first policy).
- `w_early`: load the weight before the sum-of-squares reduction, so its latency overlaps it.
- `reload_hint`: None keeps x in registers across the reduction; a LOAD_HINTS name loads x again
  after it (an L2 hit: the row was just read), with that hint. Two passes over x, as Inductor's
  looped reduction does, so fewer registers are live and more CTAs fit on an SM.
- `tiles_per_cta` R > 1: each CTA handles R row tiles (tile b, b + G, b + 2G, ... for a grid of
  G = ceil(tiles / R)), with the next tile's x loads issued before the current tile's reduction
  and store (double-buffered registers); the weight is loaded once per CTA.
- `threads_per_row`: overrides the width's default split (vecs_per_thread follows).
The knob sets timed against QuACK are declared variants, kernels/rmsnorm/variants.py
(`sweep rmsnorm --impl cutedsl,cutedsl:t256,... --bench`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import cutlass
from cutlass import Float32, cute, utils

from kernels.l2_policy import l2_policy
from kernels.trace import record, record_slice

COPY_BITS = 128
MAX_VECS_PER_THREAD = (
    8  # registers per thread stay small; more threads per row beyond that
)
MIN_CTA_THREADS = 128
MAX_THREADS_PER_ROW = 1024
# Rows of >= 512 vectors (4096+ bf16) default to Inductor's schedule, measured faster than the
# one-pass split and QuACK at 16384 x 7168 and x 4096 (docs/perf/rmsnorm.md): at most 2 vectors
# per thread, x read with evict_last for the sum of squares and again with evict_first after it.
TWO_PASS_MIN_VECS = 512
TWO_PASS_VECS_PER_THREAD = 2
TWO_PASS_KNOBS = {"load_hint": "el_l2el", "reload_hint": "ef_l2ef", "w_early": False}
KNOBS = ("load_hint", "store_hint", "w_early", "reload_hint", "tiles_per_cta")

_L1 = cute.nvgpu.CacheEvictionPriority
# name -> (copy op, atom kwargs, L2 cache policy or None). "none" is the plain universal copy.
LOAD_HINTS = {
    "none": None,
    "na": (
        "g2r",
        {"l1c_evict_priority": _L1.NO_ALLOCATE},
        None,
    ),  # ld.global.L1::no_allocate
    "ef": (
        "g2r",
        {"l1c_evict_priority": _L1.EVICT_FIRST},
        None,
    ),  # ld.global.L1::evict_first
    "cs": (
        "g2r",
        {"load_cache_mode": cute.nvgpu.LoadCacheMode.STREAMING},
        None,
    ),  # ld.global.cs
    "nc": ("g2r", {"invariant": True}, None),  # ld.global.nc (the read-only path)
    "na_l2ef": (
        "g2r",
        {"l1c_evict_priority": _L1.NO_ALLOCATE},
        "evict_first",
    ),  # + .L2::cache_hint evict_first
    # Inductor's eviction_policy="evict_last" / "evict_first" (L1 priority + L2 policy)
    "el_l2el": ("g2r", {"l1c_evict_priority": _L1.EVICT_LAST}, "evict_last"),
    "ef_l2ef": ("g2r", {"l1c_evict_priority": _L1.EVICT_FIRST}, "evict_first"),
}
STORE_HINTS = {
    "none": None,
    "cs": (
        "r2g",
        {"store_cache_mode": cute.nvgpu.StoreCacheMode.STREAMING},
        None,
    ),  # st.global.cs
    "na": (
        "r2g",
        {"l1c_evict_priority": _L1.NO_ALLOCATE},
        None,
    ),  # st.global.L1::no_allocate
    "l2ef": ("r2g", {}, "evict_first"),  # st.global.L2::cache_hint with an evict-first policy
}


@dataclass(frozen=True)
class RmsNormConfig:
    n: int
    vec: int  # elements per 16-byte vector
    threads_per_row: int
    rows_per_cta: int
    vecs_per_thread: int
    load_hint: str = "none"
    store_hint: str = "none"
    w_early: bool = True  # measured (docs/perf/rmsnorm.md, variants): at least QuACK's speed
    reload_hint: str | None = None
    tiles_per_cta: int = 1

    @classmethod
    def for_width(
        cls, n: int, dtype_width: int, threads_per_row: int | None = None, **knobs
    ) -> RmsNormConfig:
        if n <= 0:
            raise ValueError(f"rmsnorm width must be positive, got {n}")
        vec = COPY_BITS // dtype_width
        while n % vec:  # odd widths fall back to narrower (still aligned) vectors
            vec //= 2
        n_vecs = n // vec
        if threads_per_row is None and not knobs and n_vecs >= TWO_PASS_MIN_VECS:
            threads = 1 << (-(-n_vecs // TWO_PASS_VECS_PER_THREAD) - 1).bit_length()
            return cls.for_width(n, dtype_width, min(threads, MAX_THREADS_PER_ROW), **TWO_PASS_KNOBS)
        if threads_per_row is None:
            threads = 1
            while (
                threads < MAX_THREADS_PER_ROW
                and -(-n_vecs // threads) > MAX_VECS_PER_THREAD
            ):
                threads *= 2
            threads = max(threads, min(32, 1 << (n_vecs - 1).bit_length()))
        else:
            threads = threads_per_row
            if threads & (threads - 1) or not 1 <= threads <= MAX_THREADS_PER_ROW:
                raise ValueError(
                    f"threads_per_row must be a power of two <= {MAX_THREADS_PER_ROW}, got {threads}"
                )
            if threads > n_vecs:
                raise ValueError(
                    f"threads_per_row {threads} > {n_vecs} vectors in a row of {n}"
                )
        vecs_per_thread = -(-n_vecs // threads)
        if vecs_per_thread > 4 * MAX_VECS_PER_THREAD:
            raise ValueError(f"rmsnorm width {n} is too wide for one CTA per row")
        rows = max(1, MIN_CTA_THREADS // threads)
        cfg = cls(n, vec, threads, rows, vecs_per_thread, **knobs)
        if (
            cfg.load_hint not in LOAD_HINTS
            or cfg.store_hint not in STORE_HINTS
            or cfg.reload_hint not in (None, *LOAD_HINTS)
        ):
            raise ValueError(
                f"unknown cache hint {cfg.load_hint!r} / {cfg.store_hint!r} / {cfg.reload_hint!r}"
            )
        if cfg.tiles_per_cta < 1:
            raise ValueError(f"tiles_per_cta must be >= 1, got {cfg.tiles_per_cta}")
        if cfg.tiles_per_cta > 1 and cfg.reload_hint is not None:
            raise ValueError("reload_hint needs tiles_per_cta == 1")
        return cfg

    @property
    def knobs(self) -> dict:
        """The tuning knobs that differ from the defaults (threads_per_row is not among them)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in KNOBS and getattr(self, f.name) != f.default
        }

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


def _copy_atom(hint, dtype, bits):
    if hint is None:
        return cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=bits
        )
    kind, kwargs, _ = hint
    op = cute.nvgpu.CopyG2ROp() if kind == "g2r" else cute.nvgpu.CopyR2GOp()
    return cute.make_copy_atom(op, dtype, num_bits_per_copy=bits, **kwargs)


class RmsNormKernel:
    """Compile-time parameters: dtype, width, weight present, eps, tuning knobs (RmsNormConfig:
    threads_per_row, load_hint, store_hint, w_early, tiles_per_cta). Rows are a runtime size."""

    def __init__(
        self, dtype: type, n: int, has_weight: bool, eps: float = 1e-6, **knobs
    ):
        self.dtype = dtype
        self.cfg = RmsNormConfig.for_width(n, dtype.width, **knobs)
        self.has_weight = has_weight
        self.eps = eps

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        cfg = self.cfg
        n_tiles = cute.ceil_div(mX.shape[0], cfg.rows_per_cta)
        grid = n_tiles
        if cutlass.const_expr(cfg.tiles_per_cta > 1):
            grid = cute.ceil_div(n_tiles, cfg.tiles_per_cta)
        self.kernel(mX, mW, mO).launch(
            grid=[grid, 1, 1], block=[cfg.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        cfg = self.cfg
        looped = cfg.tiles_per_cta > 1
        shape, stride = cfg.tv_layout()
        tv_layout = cute.make_layout(shape, stride=stride)
        tiler = (cfg.rows_per_cta, cfg.cols_per_tile)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        n_rows = mX.shape[0]
        stages = (
            2 if looped else 1
        )  # looped: the partials alternate, so one barrier per tile suffices

        smem = utils.SmemAllocator()
        partials = smem.allocate_tensor(
            Float32,
            cute.make_layout((cfg.rows_per_cta, cfg.warps_per_row, stages)),
            byte_alignment=4,
        )

        gX = cute.local_tile(mX, tiler, (bidx, 0))
        gO = cute.local_tile(mO, tiler, (bidx, 0))
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), tiler, (bidx, 0))

        bits = cfg.vec * mX.element_type.width
        atom = _copy_atom(None, mX.element_type, bits)
        ld_atom, ld_kw = self.hinted(LOAD_HINTS[cfg.load_hint], mX.element_type, bits)
        st_atom, st_kw = self.hinted(STORE_HINTS[cfg.store_hint], mO.element_type, bits)
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
        reload = None  # (x tile, atom, kwargs) of the second read of x, when reload_hint is set
        if cutlass.const_expr(cfg.reload_hint is not None):
            reload = (tXgX, *self.hinted(LOAD_HINTS[cfg.reload_hint], mX.element_type, bits))

        # The partition is ((vec, vecs_per_thread), 1, 1): vector j is mode-0 coordinate (None, j).
        # (Indexing j in mode 2, a size-1 stride-0 mode, silently copies the whole fragment and
        # predicates on vector 0: full-width rows pass, ragged rows write past their end.)
        # Columns past the row are never loaded and stay 0 in the fragments: they add nothing.
        tXrX = cute.make_fragment_like(tXgX)
        tXrX.fill(0)
        self.load_x(ld_atom, ld_kw, tXgX, tXrX, tXcX, n_rows, "x vector")

        w_first = self.has_weight and (cfg.w_early or looped)
        tXrW = None
        if cutlass.const_expr(w_first):
            tXrW = self.load_w(atom, mW, thr_copy, tXcX)

        if cutlass.const_expr(not looped):
            self.finish(
                0,
                tXrX,
                tXgO,
                tXcX,
                n_rows,
                mW,
                thr_copy,
                tXrW,
                partials,
                st_atom,
                st_kw,
                atom,
                w_first,
                reload,
            )
        else:
            tXrN = cute.make_fragment_like(
                tXgX
            )  # the next tile's x, loaded while this one is reduced
            tXrN.fill(0)
            for k in cutlass.range(cfg.tiles_per_cta, unroll=1):
                tile = bidx + k * gdim
                tXgOk = thr_copy.partition_D(cute.local_tile(mO, tiler, (tile, 0)))
                tXcXk = thr_copy.partition_S(
                    cute.local_tile(
                        cute.make_identity_tensor(mX.shape), tiler, (tile, 0)
                    )
                )
                # prefetch the CTA's next tile (its rows are past M after the CTA's last tile)
                nxt = tile + gdim
                tXgN = thr_copy.partition_S(cute.local_tile(mX, tiler, (nxt, 0)))
                tXcN = thr_copy.partition_S(
                    cute.local_tile(
                        cute.make_identity_tensor(mX.shape), tiler, (nxt, 0)
                    )
                )
                self.load_x(ld_atom, ld_kw, tXgN, tXrN, tXcN, n_rows, "next x vector")
                self.finish(
                    k,
                    tXrX,
                    tXgOk,
                    tXcXk,
                    n_rows,
                    mW,
                    thr_copy,
                    tXrW,
                    partials,
                    st_atom,
                    st_kw,
                    atom,
                    w_first,
                    None,
                )
                tXrX.store(tXrN.load())

    @staticmethod
    def hinted(hint, dtype, bits) -> tuple[cute.CopyAtom, dict]:
        """The copy atom of a LOAD_HINTS / STORE_HINTS entry and its cute.copy kwargs (the L2
        cache policy, made here, in the kernel)."""
        kw = {} if hint is None or hint[2] is None else {"cache_policy": l2_policy(hint[2])}
        return _copy_atom(hint, dtype, bits), kw

    @cute.jit
    def load_x(
        self,
        ld_atom: cute.CopyAtom,
        ld_kw: cutlass.Constexpr,
        tXgX: cute.Tensor,
        tXrX: cute.Tensor,
        tXcX: cute.Tensor,
        n_rows: cutlass.Int32,
        stage: cutlass.Constexpr,
    ):
        row_ok = tXcX[0][0] < n_rows
        for j in cutlass.range_constexpr(self.cfg.vecs_per_thread):
            if row_ok and tXcX[(0, j), 0, 0][1] < self.cfg.n:
                cute.copy(
                    ld_atom,
                    vector(tXgX, j, stage + " (global)"),
                    vector(tXrX, j, stage + " (registers)"),
                    **ld_kw,
                )

    @cute.jit
    def finish(
        self,
        k,
        tXrX: cute.Tensor,
        tXgO: cute.Tensor,
        tXcX: cute.Tensor,
        n_rows: cutlass.Int32,
        mW,
        thr_copy,
        tXrW,
        partials: cute.Tensor,
        st_atom: cute.CopyAtom,
        st_kw: cutlass.Constexpr,
        atom: cute.CopyAtom,
        w_first: cutlass.Constexpr,
        reload: cutlass.Constexpr,
    ):
        """Reduce the tile in tXrX, scale it and store it: the sum of squares per row across the
        row's threads (shuffles, then the partials in smem, stage k % 2 when looped). With
        `reload`, x is read again for the scaling instead of being kept."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        x = tXrX.load().to(Float32)
        sum_sq = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        sum_sq = cute.arch.warp_reduction_sum(
            sum_sq, threads_in_group=min(cfg.threads_per_row, 32)
        )
        if cutlass.const_expr(cfg.warps_per_row > 1):
            lane = tidx % 32
            row_in_cta = tidx // cfg.threads_per_row
            warp_in_row = (tidx % cfg.threads_per_row) // 32
            stage = k % cute.size(partials, mode=[2])
            if lane == 0:
                partials[row_in_cta, warp_in_row, stage] = sum_sq
            cute.arch.barrier()
            sum_sq = Float32(0.0)
            for w in cutlass.range_constexpr(cfg.warps_per_row):
                sum_sq += partials[row_in_cta, w, stage]

        rstd = cute.math.rsqrt(sum_sq / cfg.n + self.eps)
        if cutlass.const_expr(reload is not None):
            tXgX, ld_atom, ld_kw = reload
            self.load_x(ld_atom, ld_kw, tXgX, tXrX, tXcX, n_rows, "x vector, again")
            x = tXrX.load().to(Float32)
        y = x * rstd
        if cutlass.const_expr(self.has_weight):
            if cutlass.const_expr(not w_first):
                tXrW = self.load_w(atom, mW, thr_copy, tXcX)
            y = y * tXrW.load().to(Float32)

        tXrO = cute.make_fragment_like(tXgO)
        tXrO.store(y.to(tXgO.element_type))
        row_ok = tXcX[0][0] < n_rows
        for j in cutlass.range_constexpr(cfg.vecs_per_thread):
            if row_ok and tXcX[(0, j), 0, 0][1] < cfg.n:
                cute.copy(
                    st_atom,
                    vector(tXrO, j, "y vector (registers)"),
                    vector(tXgO, j, "y vector (global)"),
                    **st_kw,
                )

    @cute.jit
    def load_w(
        self, atom: cute.CopyAtom, mW: cute.Tensor, thr_copy, tXcX: cute.Tensor
    ) -> cute.Tensor:
        # The weight is the same for every row: a (rows, n) view with row stride 0.
        cfg = self.cfg
        w_rows = cute.make_tensor(
            mW.iterator,
            cute.prepend(mW.layout, cute.make_layout((cfg.rows_per_cta,), stride=(0,))),
        )
        tXgW = thr_copy.partition_S(
            cute.local_tile(w_rows, (cfg.rows_per_cta, cfg.cols_per_tile), (0, 0))
        )
        tXrW = cute.make_fragment_like(tXgW)
        tXrW.fill(0)
        for j in cutlass.range_constexpr(self.cfg.vecs_per_thread):
            if tXcX[(0, j), 0, 0][1] < self.cfg.n:
                cute.copy(
                    atom,
                    vector(tXgW, j, "w vector (global)"),
                    vector(tXrW, j, "w vector (registers)"),
                )
        return tXrW
