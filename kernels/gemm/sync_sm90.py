"""The small-M FP8 GEMM on warp MMA (`mma.sync`), no TMA, no shared-memory ring: decode's weight stream as
plain 16-byte loads straight into the MMA's registers (issue #21; variant `cutedsl:sync`).

Why: at decode the rule's TMA kernel spends ~3 us a call that a copy of the same bytes does not (session 45's
phase stamps: barrier set-up, a first stage landing 1.3-1.6 us after its loads, the split-K merge), and
without loading W at all (`ko-no-b`) it still takes 3.6-4.2 us on the 2-4 MB layers, where the copy of
their bytes takes ~1.5 us. This kernel has one DRAM round trip before its first MMA and nothing else on
the way: no barriers to set up, no descriptors, one CTA-wide barrier before the K slices are summed.

Work: warp w of a CTA owns 8 weight rows (`row_warps` row groups a CTA) and one of `k_slices` K ranges.
Per 64-K chunk, lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of weight row g at byte 16t of the
chunk, and 16 bytes of token g's x row (and token g + 8's) at the same offset: those are the B operand
(8 rows) and the A operand (16 tokens) of two m16n8k32 MMAs. The MMA's k index 16h + 4t + i (h: a / b
register half, i: byte) reads chunk byte 16t + 8j + 4h + i for MMA j; that is a permutation of the
chunk's 64 K, the same for x and W, so the dot product is unchanged. Each 128-K block's two chunks (four
MMAs) accumulate in a temporary, promoted with sa[token, block] * sw[row block, block] (the DSV4 recipe,
spec §2.3 / §2.6). Tokens past M read row M - 1 (a valid row; their outputs are never stored), K
blocks past a slice's end read its last block and promote with 0: the loop has no branches.
The K slices meet in shared memory; slice 0's warp sums them and stores bf16.

The MMA's D fragment: c0, c1 = (token g, rows 2t, 2t + 1), c2, c3 = (token g + 8, same rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, memory
from cutlass._mlir import ir
from cutlass._mlir.dialects import vector
from cutlass.cute.nvgpu import warp
from cutlass.cute.runtime import make_fake_tensor

from kernels.gemm.tiling import KBLOCK

CHUNK = 64  # K bytes of one 16-byte load per lane across a quad (4 lanes x 16)
ROWS = 8  # weight rows of a warp: the MMA's N
TOKENS = 16  # tokens of an m tile: the MMA's M
MAX_THREADS = 1024


@dataclass(frozen=True)
class SyncConfig:
    """Compile-time shape of the mma.sync GEMM (kernels/gemm/sync_sm90.py)."""

    row_warps: int = 1  # 8-row weight groups a CTA
    k_slices: int = 16  # K ranges a CTA (one warp each per row group), summed in shared memory
    depth: int = 2  # 128-K blocks a warp loads before its first MMA of them (16 x depth... bytes a lane in flight)
    m_tiles: int = 1  # 16-token tiles of x (M <= 16 m_tiles)
    half: bool = True  # M <= 8: tokens 8-15 of the tile are absent (their A registers are zero, never loaded)

    def __post_init__(self) -> None:
        if self.row_warps < 1 or self.k_slices < 1 or self.warps * 32 > MAX_THREADS:
            raise ValueError(f"row_warps x k_slices must be 1-{MAX_THREADS // 32} warps, got {self}")
        if self.depth not in (1, 2, 4, 8):
            raise ValueError(f"depth must be 1, 2, 4 or 8, got {self.depth}")
        if not 1 <= self.m_tiles <= 4 or (self.half and self.m_tiles != 1):
            raise ValueError(f"m_tiles must be 1-4 (1 when half), got {self}")

    @property
    def warps(self) -> int:
        return self.row_warps * self.k_slices

    @property
    def rows(self) -> int:
        """Weight rows a CTA."""
        return ROWS * self.row_warps

    @property
    def max_m(self) -> int:
        return 8 if self.half else TOKENS * self.m_tiles

    @property
    def values(self) -> int:
        """fp32 accumulator values a lane keeps: 2 (token g) or 4 (g and g + 8) an m tile."""
        return self.m_tiles * (2 if self.half else 4)


def choose_sync_config(m: int, n: int, k: int) -> SyncConfig:
    """K split into up to 16 slices (one warp each) so that a CTA's 512 threads hold 16 x 2 K blocks of one
    8-row group in flight; narrower K (fewer blocks than 16) fills the CTA with more row groups instead."""
    if m > 4 * TOKENS:
        raise ValueError(f"the mma.sync GEMM takes M <= {4 * TOKENS}, got {m}")
    kb = k // KBLOCK
    slices = min(16, kb)
    half = m <= 8
    return SyncConfig(row_warps=max(1, 16 // slices), k_slices=slices, depth=2,
                      m_tiles=1 if half else -(-m // TOKENS), half=half)


def _words(v, n: int) -> list:
    return [Int32(vector.extract(v, dynamic_position=[], static_position=[i])) for i in range(n)]


class Fp8SyncGemm:
    def __init__(self, cfg: SyncConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(self, mX: cute.Tensor, mSA: cute.Tensor, mW: cute.Tensor, mSW: cute.Tensor, mY: cute.Tensor,
                 n_group: Int32, stream):
        c = self.cfg
        grid = (mW.shape[0] + c.rows - 1) // c.rows
        smem = c.k_slices * c.row_warps * 32 * c.values * 4
        self.kernel(mX, mSA, mW, mSW, mY, n_group).launch(grid=[grid, 1, 1], block=[32 * c.warps, 1, 1],
                                                          smem=smem, stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mSA: cute.Tensor, mW: cute.Tensor, mSW: cute.Tensor, mY: cute.Tensor,
               n_group: Int32):
        c = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        g, t = lane // 4, lane % 4
        rw, ks = warp_idx % c.row_warps, warp_idx // c.row_warps
        m, n, k = mX.shape[0], mW.shape[0], mW.shape[1]
        kb = k // KBLOCK
        ldx = mX.layout.stride[0]
        n0 = (bidx * c.row_warps + rw) * ROWS
        n0c = cutlass.min(n0, n - ROWS)  # a warp past N streams the last rows again and stores nothing
        grp = n0c // n_group
        x_col0 = grp * k  # the group's first x column (grouped wo_a)
        sa_col0 = grp * kb
        per = (kb + c.k_slices - 1) // c.k_slices
        b_lo = ks * per
        b_hi = cutlass.min(b_lo + per, kb)

        vec4 = ir.VectorType.get([4], Int32.mlir_type)
        op = warp.MmaFP8Op(cutlass.Float8E4M3FN, Float32, (16, 8, 32))
        mma = cute.make_tiled_mma(op)
        thr = mma.get_slice(lane)
        frag_a = mma.make_fragment_A(thr.partition_shape_A((TOKENS, 32)))
        frag_b = mma.make_fragment_B(thr.partition_shape_B((ROWS, 32)))
        words_a = cute.recast_tensor(frag_a, Int32)
        words_b = cute.recast_tensor(frag_b, Int32)
        tmp = mma.make_fragment_C(thr.partition_shape_C((TOKENS, ROWS)))
        accs = [mma.make_fragment_C(thr.partition_shape_C((TOKENS, ROWS))) for _ in range(c.m_tiles)]
        for mt in cutlass.range_constexpr(c.m_tiles):
            accs[mt].fill(0.0)
        if cutlass.const_expr(c.half):
            words_a[1] = Int32(0)
            words_a[3] = Int32(0)
        # the x rows of this lane: token g (and g + 8) of each m tile, clamped to a real row
        x_rows = []
        for mt in cutlass.range_constexpr(c.m_tiles):
            x_rows.append(cutlass.min(mt * TOKENS + g, m - 1))
            if cutlass.const_expr(not c.half):
                x_rows.append(cutlass.min(mt * TOKENS + g + 8, m - 1))
        w_base = mW.iterator + (n0c + g) * k + 16 * t
        x_base = [mX.iterator + r * ldx + x_col0 + 16 * t for r in x_rows]
        sw_row = n0c // KBLOCK

        for b0 in cutlass.range(b_lo, b_hi, c.depth, unroll=1):
            wv, xv, scale = [], [], []
            for d in cutlass.range_constexpr(c.depth):
                b = b0 + d
                bb = cutlass.min(b, b_hi - 1)  # past the slice: its last block again, promoted with 0
                live = Float32(1.0) if b < b_hi else Float32(0.0)
                for ch in cutlass.range_constexpr(KBLOCK // CHUNK):
                    off = bb * KBLOCK + ch * CHUNK
                    wv.append(cute.arch.load(w_base + off, vec4, level1_eviction_priority="evict_no_allocate"))
                    for xb in x_base:
                        xv.append(cute.arch.load(xb + off, vec4))
                sw = mSW[sw_row, bb] * live
                scale.append([mSA[r, sa_col0 + bb] * sw for r in x_rows])
            nx = len(x_rows)
            for d in cutlass.range_constexpr(c.depth):
                for mt in cutlass.range_constexpr(c.m_tiles):
                    tmp.fill(0.0)
                    for ch in cutlass.range_constexpr(KBLOCK // CHUNK):
                        i = d * (KBLOCK // CHUNK) + ch
                        w4 = _words(wv[i], 4)
                        lo = _words(xv[i * nx + mt * (1 if c.half else 2)], 4)
                        hi = None if c.half else _words(xv[i * nx + mt * 2 + 1], 4)
                        for j in cutlass.range_constexpr(2):
                            words_a[0] = lo[2 * j]
                            words_a[2] = lo[2 * j + 1]
                            if cutlass.const_expr(not c.half):
                                words_a[1] = hi[2 * j]
                                words_a[3] = hi[2 * j + 1]
                            words_b[0] = w4[2 * j]
                            words_b[1] = w4[2 * j + 1]
                            cute.gemm(mma, tmp, frag_a, frag_b, tmp)
                    s_lo = scale[d][mt * (1 if c.half else 2)]
                    accs[mt][0] += tmp[0] * s_lo
                    accs[mt][1] += tmp[1] * s_lo
                    if cutlass.const_expr(not c.half):
                        s_hi = scale[d][mt * 2 + 1]
                        accs[mt][2] += tmp[2] * s_hi
                        accs[mt][3] += tmp[3] * s_hi

        # the K slices meet in shared memory: red[slice][row group][lane][value]
        smem = memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((c.values, 32, c.row_warps, c.k_slices)), 16)
        per_tile = c.values // c.m_tiles
        for mt in cutlass.range_constexpr(c.m_tiles):
            for v in cutlass.range_constexpr(per_tile):
                red[mt * per_tile + v, lane, rw, ks] = accs[mt][v]
        cute.arch.barrier()
        if ks == 0 and n0 < n:
            for mt in cutlass.range_constexpr(c.m_tiles):
                for v in cutlass.range_constexpr(per_tile):
                    s = accs[mt][v]
                    for q in cutlass.range_constexpr(1, c.k_slices):
                        s += red[mt * per_tile + v, lane, rw, q]
                    tok = mt * TOKENS + g + 8 * (v // 2)
                    if tok < m:
                        mY[tok, n0 + 2 * t + v % 2] = s.to(cutlass.BFloat16)


def fake_sync_args() -> tuple:
    """x (M, G*K) fp8, sa (M, G*K/128) fp32 MN-major, w (N, K) fp8, sw (N/128, K/128) fp32, y (M, N) bf16,
    n_group; every size a runtime value."""
    m, n, ka, k, kba, kb, nb = (cute.sym_int32() for _ in range(7))
    fp8 = cutlass.Float8E4M3FN
    x = make_fake_tensor(fp8, (m, ka), (cute.sym_int64(divisibility=KBLOCK), 1), assumed_align=16)
    w = make_fake_tensor(fp8, (n, k), (cute.sym_int64(divisibility=KBLOCK), 1), assumed_align=16)
    sa = make_fake_tensor(Float32, (m, kba), (1, cute.sym_int64()), assumed_align=4)
    sw = make_fake_tensor(Float32, (nb, kb), (cute.sym_int64(), 1), assumed_align=4)
    y = make_fake_tensor(cutlass.BFloat16, (m, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16)
    return x, sa, w, sw, y, Int32(128)
