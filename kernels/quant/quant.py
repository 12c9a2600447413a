"""Activation quantisation in CuTeDSL: bf16 → FP8 e4m3 or MXFP4 e2m1 codes + ue8m0 scales (spec §2.3-§2.5).

Formats (one kernel, compile-time switches):
- fp8:   per `block` (128 for GEMM inputs, 64 for the KV cache) s = 2^ceil(log2(max(amax,1e-4)/448)),
         code = e4m3_RNE(clamp(x/s, ±448)); one uint8 code per element.
- mxfp4: per 32, s = 2^ceil(log2(max(amax, 6·2^-126)/6)), code = e2m1_RNE(clamp(x/s, ±6)); two codes
         per byte, element 2k in the low nibble. With `rotate`, each 128-wide row is first turned
         into bf16(H_128·x·128^-0.5) (the indexer's `rotate_activation`).
Scales are written as ue8m0 bytes (biased exponents), one per block.

One source for sm_90a and sm_100a: 128-bit loads, warp shuffles and `cvt...e4m3x2` (sm_89+).

Layout of the work (memory-bound: read x once, write codes + scales once):
- A thread owns 16-byte vectors of 8 elements; thread t of a row holds vectors t, t + T, ...
  (T = threads per row), so consecutive threads read consecutive vectors.
- T is a multiple of block/8, so the block/8 lanes that share a block sit in one aligned shuffle
  group; the block amax is a butterfly max over that group. Blocks never straddle a row.
- The Hadamard rotation (n = 128, T = 16) is a 3-stage in-register butterfly over a vector's
  8 elements followed by 4 shuffle stages across the 16 lanes: H_128 = H_16 (lanes) ⊗ H_8 (elements).
- Rows are a runtime size and may have a row stride > n (a column slice such as kv[:, :448]).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8

from kernels.quant.numerics import (
    cute_abs, e2m1_code, e4m3x2, inv_pow2, prmt, round_bf16x2, ue8m0_exponent,
)
from kernels.quant.rotate import HadamardMxfp4

VEC = 8  # bf16 elements per 16-byte vector
MAX_VECS_PER_THREAD = 8
MAX_THREADS_PER_ROW = 256
CTA_THREADS = 256
FORMATS = {"fp8": (448.0, 1e-4), "mxfp4": (6.0, 6.0 * 2.0**-126)}  # qmax, amax floor
HADAMARD_N = 128


@dataclass(frozen=True)
class QuantConfig:
    fmt: str
    n: int
    block: int
    rotate: bool
    threads_per_row: int
    vecs_per_thread: int
    rows_per_cta: int

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
        threads = block // VEC  # (the rotation has its own 4-lanes-per-row layout, `RotateV2`)
        while threads < MAX_THREADS_PER_ROW and -(-n_vecs // threads) > MAX_VECS_PER_THREAD:
            threads *= 2
        vecs = -(-n_vecs // threads)
        if vecs > MAX_VECS_PER_THREAD:
            raise ValueError(f"width {n} is too wide for one CTA per row")
        return cls(fmt, n, block, rotate, threads, vecs, max(1, CTA_THREADS // threads))

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
        """A CTA's tile: rows_per_cta rows, vecs_per_thread passes of one vector per thread."""
        return self.rows_per_cta, vec * self.threads_per_row * self.vecs_per_thread

    def copy_tiler(self, vec: int) -> tuple[int, int]:
        """One pass: every thread moves one vector."""
        return self.rows_per_cta, vec * self.threads_per_row

    def tv_layout(self, vec: int):
        """(thread, value) → (row, col) in a column-major copy tile; thread = t + T·row."""
        r, t = self.rows_per_cta, self.threads_per_row
        return cute.make_layout(((t, r), vec), stride=((vec * r, 1), r))


# ------------------------------------------------------------------ v2: Hadamard-128 + MXFP4, 4 lanes per row
ROT_LANES = 4  # lanes per 128-wide row
ROT_SLOTS = HADAMARD_N // (VEC * ROT_LANES)  # 16-byte vectors per lane
ROT_ROWS_PER_CTA = CTA_THREADS // ROT_LANES


class RotateV2:
    """The rotate path with 4 lanes per row (mixed into QuantKernel).

    Lane l of a row loads vectors l, l+4, l+8, l+12: one warp load instruction reads 64 contiguous
    bytes (two full sectors) of each of 8 rows, and a thread has 4 x 16 B in flight. Register slot
    r = 8j + e holds element 8(l + 4j) + e, so element bits 0-2 are e, bits 3-4 the lane, 5-6 j.

    The butterfly runs the stages in v1's order (element bit 0, 1, ..., 6: every fp32 sum is rounded
    exactly as in v1, hence the same bits). Stages 0-2 and 5-6 are in registers. Stages 3 and 4 pair
    lanes l and l^1 (l^2): instead of both lanes exchanging all 32 values, each keeps the half of the
    pairs with register bit R = 0 (lower lane) or R = 1 (upper) and sends the other half: 16 shuffles
    per stage, after which register bit R holds element bit 3 (4) and the lane bit the element bit R
    held (R = 4: element bit 2 for stage 3; R = 2: element bit 1 for stage 4). The upper lane forms
    keep - recv = b - a = -(a - b): the value is stored negated (RNE is odd-symmetric, and later
    stages only add values of equal sign), and the 128^-0.5 scale carries the sign back.

    After the butterfly a lane holds, for each 8-element group g (16 per row), elements 2k, 2k+1
    with k = lane's (el bit 1, el bit 2): one code byte per group, nibble pairs in one lane; the 32
    elements of block j are slots 8j..8j+7 on the 4 lanes (amax: two shuffle stages). The code bytes
    go through a 4x4 lane transpose (8 shuffles) and a 4x4 byte transpose (8 PRMT), so lane m
    stores row bytes 16m..16m+15 (one 16 B store, 64 contiguous bytes per row) and scale byte m.
    """

    @cute.jit
    def launch_rotate_v2(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        self.kernel_rotate_v2(mX, mQ, mS).launch(
            grid=[cute.ceil_div(mX.shape[0], ROT_ROWS_PER_CTA), 1, 1], block=[CTA_THREADS, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel_rotate_v2(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % ROT_LANES
        row = bidx * ROT_ROWS_PER_CTA + tidx // ROT_LANES
        row_ok = row < mX.shape[0]

        gX = cute.zipped_divide(mX, (1, VEC))
        raw = cute.make_rmem_tensor((VEC, ROT_SLOTS), mX.element_type)  # slot r = e + 8j
        raw.fill(0)
        if row_ok:
            for j in cutlass.range_constexpr(ROT_SLOTS):  # all four loads before any math
                cute.autovec_copy(gX[(0, None), (row, lane + ROT_LANES * j)], raw[None, j])
        x = cute.make_rmem_tensor((VEC, ROT_SLOTS), Float32)
        x.store(raw.load().to(Float32))
        self.hadamard_v2(x, lane)
        self.quantise_v2(x, lane, row, row_ok, mQ, mS)

    @cute.jit
    def hadamard_v2(self, x: cute.Tensor, lane: Int32):
        n = VEC * ROT_SLOTS
        for h in (1, 2, 4):  # element bits 0-2: register bits 0-2
            for i in cutlass.range_constexpr(n):
                if cutlass.const_expr(i & h == 0):
                    a, b = x[i], x[i + h]
                    x[i], x[i + h] = a + b, a - b
        for o, r_bit in ((1, 4), (2, 2)):  # element bits 3, 4: lane bit o, swapped with register bit r_bit
            upper = (lane & o) != 0
            for i in cutlass.range_constexpr(n):
                if cutlass.const_expr(i & r_bit == 0):
                    lo, hi = x[i], x[i + r_bit]
                    keep = cutlass.select_(upper, hi, lo)
                    recv = cute.arch.shuffle_sync_bfly(cutlass.select_(upper, lo, hi), offset=o)
                    x[i], x[i + r_bit] = keep + recv, keep - recv
        for h in (8, 16):  # element bits 5, 6: register bits 3, 4
            for i in cutlass.range_constexpr(n):
                if cutlass.const_expr(i & h == 0):
                    a, b = x[i], x[i + h]
                    x[i], x[i + h] = a + b, a - b
        # signs: the upper lane of stage 3 holds register bit 4 negated, of stage 4 register bit 2
        k = Float32(HADAMARD_N**-0.5)
        s4 = cutlass.select_((lane & 1) != 0, -k, k)
        s2 = cutlass.select_((lane & 2) != 0, Float32(-1.0), Float32(1.0))
        s24 = s4 * s2
        s2k = s2 * k
        for i in cutlass.range_constexpr(0, n, 2):  # slots i, i + 1 share the sign class (bits 1, 2 of i)
            c = k
            if cutlass.const_expr(i & 6 == 4):
                c = s4
            elif cutlass.const_expr(i & 6 == 2):
                c = s2k
            elif cutlass.const_expr(i & 6 == 6):
                c = s24
            x[i], x[i + 1] = round_bf16x2(x[i] * c, x[i + 1] * c)

    @cute.jit
    def quantise_v2(self, x: cute.Tensor, lane: Int32, row: Int32, row_ok, mQ: cute.Tensor, mS: cute.Tensor):
        qmax, floor = FORMATS["mxfp4"]
        words = cute.make_rmem_tensor((ROT_SLOTS,), Int32)
        my_exp = Int32(0)
        for j in cutlass.range_constexpr(ROT_SLOTS):  # block j = slots 8j..8j+7 on the row's 4 lanes
            amax = cute_abs(x[VEC * j])
            for e in cutlass.range_constexpr(1, VEC):
                amax = cute.arch.fmax(amax, cute_abs(x[VEC * j + e]))
            amax = cute.arch.warp_reduction_max(amax, threads_in_group=ROT_LANES)
            exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(floor)), 1.0 / qmax)
            my_exp = cutlass.select_(lane == j, exp, my_exp)
            inv_s = inv_pow2(exp)
            w = Int32(0)
            for k in cutlass.range_constexpr(4):  # group 4j + k: slots r0, r0 + 1 (element bit 0)
                r0 = VEC * j + 4 * (k & 1) + 2 * (k >> 1)
                byte = self.e2m1(x[r0] * inv_s) | (self.e2m1(x[r0 + 1] * inv_s) << 4)
                w = w | (byte << (8 * k))
            words[j] = w
        # 4x4 transpose across the row's lanes: lane m gets word m of every lane, in lane order
        for s in (1, 2):
            up = (lane & s) != 0
            for q in cutlass.range_constexpr(ROT_SLOTS):
                if cutlass.const_expr(q & s == 0):
                    lo, hi = words[q], words[q | s]
                    recv = cute.arch.shuffle_sync_bfly(cutlass.select_(up, lo, hi), offset=s)
                    words[q] = cutlass.select_(up, recv, lo)
                    words[q | s] = cutlass.select_(up, hi, recv)
        # words[q] = lane q's bytes of groups 4m..4m+3; lane q holds byte position b = (q >> 1) | (q & 1) << 1
        q0, q1, q2, q3 = words[0], words[2], words[1], words[3]  # byte positions 0, 1, 2, 3
        t0, t1 = prmt(q0, q1, 0x5140), prmt(q0, q1, 0x7362)
        t2, t3 = prmt(q2, q3, 0x5140), prmt(q2, q3, 0x7362)
        out = cute.make_rmem_tensor((ROT_SLOTS,), Int32)
        out[0], out[1] = prmt(t0, t2, 0x5410), prmt(t0, t2, 0x7632)
        out[2], out[3] = prmt(t1, t3, 0x5410), prmt(t1, t3, 0x7632)
        if row_ok:
            gQ = cute.zipped_divide(cute.recast_tensor(mQ, Int32), (1, ROT_SLOTS))
            cute.autovec_copy(out, gQ[(0, None), (row, lane)])
            mS[row, lane] = Uint8(my_exp)


class QuantKernel(HadamardMxfp4, RotateV2):
    """Compile-time: format, width, block, rotation. Runtime: rows and the input's row stride.

    The rotate path runs `kernel_rotate_v2` (4 lanes per row); `kernel` serves every other format.
    v1 of the rotate path (16 lanes per row, 73.5 µs at 262,144 rows vs v2's 51.1) is in git history
    and its figures in benchmarks/results/quant-probe-h100-66b5a7b.json.
    """

    def __init__(self, fmt: str, n: int, block: int, rotate: bool = False):
        self.cfg = QuantConfig.make(fmt, n, block, rotate)

    def e2m1(self, v: Float32) -> Int32:
        return e2m1_code(v)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        cfg = self.cfg
        if cutlass.const_expr(cfg.rotate):
            self.launch_rotate(mX, mQ, mS, stream)
        else:
            self.kernel(mX, mQ, mS).launch(
                grid=[cute.ceil_div(mX.shape[0], cfg.rows_per_cta), 1, 1], block=[cfg.threads, 1, 1], stream=stream,
            )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane_in_row = tidx % cfg.threads_per_row

        x_tiler, q_tiler = cfg.tiler(VEC), cfg.tiler(cfg.code_vec)
        x_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=VEC * 16)
        q_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint8, num_bits_per_copy=cfg.code_vec * 8)
        x_copy = cute.make_tiled_copy(x_atom, cfg.tv_layout(VEC), cfg.copy_tiler(VEC)).get_slice(tidx)
        q_copy = cute.make_tiled_copy(q_atom, cfg.tv_layout(cfg.code_vec), cfg.copy_tiler(cfg.code_vec)).get_slice(tidx)
        tXgX = x_copy.partition_S(cute.local_tile(mX, x_tiler, (bidx, 0)))
        tXcX = x_copy.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), x_tiler, (bidx, 0)))
        tQgQ = q_copy.partition_D(cute.local_tile(mQ, q_tiler, (bidx, 0)))

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
                mS[row, col // cfg.block] = Uint8(exp)
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
