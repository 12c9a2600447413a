"""The indexer's Hadamard-128 + MXFP4 quantisation (spec §2.4, §2.5), v4: two lanes per row, staged loads.

rows of 128 bf16 → bf16(H_128·x·128^-0.5) → per 32: ue8m0 scale + e2m1 codes (two per byte, element
2k in the low nibble), bit-exact with the reference's butterfly (fast_hadamard_transform's order:
element bit 0, 1, ..., 6; each stage (a + b, a − b) rounded in fp32, then ·128^-0.5, then bf16).

Loads. Warp w of a CTA owns rows 16w..16w+15; copy j of lane t moves vector t % 16 of row 2j + t // 16
(cp.async, 16 bytes), so every warp instruction reads 512 contiguous bytes like a copy does, into a
[row][vector] smem tile whose 288-byte row pitch keeps both sides conflict-free; each lane then reads
its own vectors back. (v3 loaded straight into registers, one 32-byte sector of each of 16 rows per
warp instruction: that pattern alone cost 33 µs where a copy's costs 29, docs/perf/quant.md.)

Layout. Lane l of a row holds vectors v = l + 2j (j = 0..7). Register (e, j) holds element 8v + e,
so element bits 0-2 are e, bit 3 the lane, bits 4-6 j. Stages 0-2 and 4-6 run in registers; stage 3
swaps all 64 values with the partner lane and forms fma(x, ±1, other): a + b on lane 0, a − b on
lane 1 (the same single rounding as the reference's add/sub).

Quantisation in bf16 pairs. After the rotation every value is a bf16, so the block max, the scaling
and the e2m1 rounding run on bf16x2 registers, two elements per instruction (numerics.e2m1x2_nibbles).
The pairs are elements (e, e + 4) of a vector, the order numerics.pack_codes turns into a vector's
4 code bytes with three shifts-and-adds. Block b = vectors 4b..4b+3 = j in {2b, 2b + 1} on both
lanes: its max is one u16x2 max chain and one shuffle.

Stores: the lanes swap half their code words so that lane l writes row bytes 16l..16l+15 and
32+16l..32+16l+15 (two 16-byte stores, each a full 32-byte sector per row across the pair), and
scale bytes 2l, 2l + 1.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, memory
from cutlass.cute.nvgpu import cpasync

from kernels.bits import bits_f32
from kernels.quant.numerics import (
    BF16X2_ABS, bf16x2_bits, bf16x2_pow2, e2m1x2_nibbles, ffma, pack_codes, packed, ue8m0_exponent,
)

HADAMARD_N = 128
VEC = 8  # bf16 per 16-byte vector
LANES = 2  # threads per row
VECS = HADAMARD_N // (VEC * LANES)  # vectors per lane
BLOCK = 32
THREADS = 128
ROWS_PER_CTA = THREADS // LANES
WARPS = THREADS // 32
ROWS_PER_WARP = 32 // LANES
VECS_PER_ROW = HADAMARD_N // VEC
ROW_PITCH = HADAMARD_N + 16  # smem row pitch: 32 bytes of padding put a quarter-warp's 16-byte accesses in 8 bank groups
FP4_MAX, FP4_AMAX_FLOOR = 6.0, 6.0 * 2.0**-126
PAIRS = ((0, 4), (1, 5), (2, 6), (3, 7))  # a vector's bf16x2 pairs, in numerics.pack_codes' order


class HadamardMxfp4:
    """Compile-time nothing but the format (n = 128, block 32); runtime rows and row stride."""

    @cute.jit
    def launch_rotate(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, stream):
        self.kernel_rotate(mX, mQ, mS).launch(
            grid=[cute.ceil_div(mX.shape[0], ROWS_PER_CTA), 1, 1], block=[THREADS, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel_rotate(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % LANES
        row = bidx * ROWS_PER_CTA + tidx // LANES
        row_ok = row < mX.shape[0]

        raw = self.load_row(mX, row, lane)
        x = cute.make_rmem_tensor((VEC, VECS), Float32)
        x.store(raw.load().to(Float32))
        self.hadamard(x, lane)
        pairs = self.round_to_bf16_pairs(x)
        words, exps = self.quantise(pairs)
        self.store(words, exps, lane, row, row_ok, mQ, mS)

    @cute.jit
    def load_row(self, mX: cute.Tensor, row: Int32, lane: Int32) -> cute.Tensor:
        """raw[e, j] = element 8(lane + 2j) + e of the row, through the warp's smem tile (rows past the
        end are not loaded: their slots hold garbage, and their results are never stored)."""
        tidx, _, _ = cute.arch.thread_idx()
        warp, t = tidx // 32, tidx % 32
        smem = memory.SmemAllocator()
        tile = smem.allocate_tensor(
            mX.element_type,
            cute.make_layout((VEC, (VECS_PER_ROW, ROWS_PER_WARP, WARPS)),
                             stride=(1, (VEC, ROW_PITCH, ROW_PITCH * ROWS_PER_WARP))),
            128,
        )[None, (None, None, warp)]  # this warp's (element, vector, row)
        self.copy_rows(mX, tile, row - t // LANES, t)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_warp()
        raw = cute.make_rmem_tensor((VEC, VECS), mX.element_type)
        for j in cutlass.range_constexpr(VECS):
            cute.autovec_copy(tile[None, lane + LANES * j, t // LANES], raw[None, j])
        return raw

    @cute.jit
    def copy_rows(self, mX: cute.Tensor, tile: cute.Tensor, first: Int32, t: Int32):
        """Lane t's cp.asyncs of the warp's rows first..first+15: vector t % 16 of rows 2j + t // 16,
        walking one pointer two rows per copy; rows past the end are skipped."""
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cpasync.LoadCacheMode.GLOBAL), mX.element_type,
                                   num_bits_per_copy=128)
        v, r0 = t % VECS_PER_ROW, t // VECS_PER_ROW
        mine = cute.zipped_divide(mX, (1, VEC))[(0, None), (first + r0, v)]  # keeps the 16-byte alignment
        rows = cute.make_tensor(mine.iterator, cute.make_layout((VEC, VECS), stride=(1, LANES * mX.stride[0])))
        for j in cutlass.range_constexpr(VECS):
            if first + r0 + LANES * j < mX.shape[0]:
                cute.copy(atom, rows[None, j], tile[None, v, r0 + LANES * j])

    @cute.jit
    def hadamard(self, x: cute.Tensor, lane: Int32):
        """The unnormalised butterfly, element bit 0 first; x[i] is element 8(lane + 2(i >> 3)) + (i & 7)."""
        n = VEC * VECS
        for h in (1, 2, 4):  # element bits 0-2: register bits 0-2
            self.butterfly(x, h)
        sign = cutlass.select_(lane == 0, Float32(1.0), Float32(-1.0))  # element bit 3: the lane
        for i in list(range(n)):  # a Python list: unrolled at trace time
            x[i] = ffma(x[i], sign, cute.arch.shuffle_sync_bfly(x[i], offset=1))
        for h in (8, 16, 32):  # element bits 4-6: register bits 3-5
            self.butterfly(x, h)

    @cute.jit
    def butterfly(self, x: cute.Tensor, h: int):
        for i in [i for i in range(VEC * VECS) if not i & h]:
            a, b = x[i], x[i + h]
            x[i], x[i + h] = a + b, a - b

    def e2m1x2(self, p: Int32, inv: Int32) -> Int32:
        return e2m1x2_nibbles(p, inv)

    @cute.jit
    def round_to_bf16_pairs(self, x: cute.Tensor) -> cute.Tensor:
        """bf16(x · 128^-0.5) as bf16x2 words: word 4j + k holds elements PAIRS[k] of vector j."""
        k = Float32(HADAMARD_N**-0.5)
        pairs = cute.make_rmem_tensor((len(PAIRS) * VECS,), Int32)
        for j in cutlass.range_constexpr(VECS):
            for p, (e0, e1) in enumerate(PAIRS):
                pairs[len(PAIRS) * j + p] = bf16x2_bits(x[VEC * j + e0] * k, x[VEC * j + e1] * k)
        return pairs

    @cute.jit
    def quantise(self, pairs: cute.Tensor):
        """Per block of 32: ue8m0 exponent, then one code word (4 bytes = 8 nibbles) per vector."""
        words = cute.make_rmem_tensor((VECS,), Int32)
        exps = cute.make_rmem_tensor((HADAMARD_N // BLOCK,), Int32)
        per_block = BLOCK // (VEC * LANES) * len(PAIRS)  # pair words of a block on one lane
        for b in cutlass.range_constexpr(HADAMARD_N // BLOCK):
            m = pairs[per_block * b] & BF16X2_ABS
            for w in cutlass.range_constexpr(1, per_block):
                m = packed("max.u16x2", m, pairs[per_block * b + w] & BF16X2_ABS)
            m = packed("max.u16x2", m, cute.arch.shuffle_sync_bfly(m, offset=1))
            amax = cute.arch.fmax(bits_f32(m << 16), bits_f32(m & -65536))
            exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP4_AMAX_FLOOR)), 1.0 / FP4_MAX)
            exps[b] = exp
            inv = bf16x2_pow2(exp)
            for j in cutlass.range_constexpr(2 * b, 2 * b + 2):
                words[j] = pack_codes(*[self.e2m1x2(pairs[len(PAIRS) * j + p], inv) for p in range(len(PAIRS))])
        return words, exps

    @cute.jit
    def store(self, words: cute.Tensor, exps: cute.Tensor, lane: Int32, row: Int32, row_ok, mQ, mS):
        """Lane l holds the code words of vectors l + 2j; after swapping half of them it stores vectors
        4l..4l+3 and 8+4l..8+4l+3 (row bytes 16l.. and 32+16l..), and scales 2l, 2l + 1."""
        first = lane == 0
        # (half, word): bytes 32·half + 16·lane + 4·word; row-major, so that a half is one 16-byte store
        out = cute.make_rmem_tensor(cute.make_layout((2, 4), stride=(4, 1)), Int32)
        for half in cutlass.range_constexpr(2):
            for k in cutlass.range_constexpr(2):
                mine, theirs = 4 * half + k, 4 * half + 2 + k  # lane 0 keeps vectors 8h + 2k, sends 8h + 4 + 2k
                got = cute.arch.shuffle_sync_bfly(cutlass.select_(first, words[theirs], words[mine]), offset=1)
                out[half, 2 * k] = cutlass.select_(first, words[mine], got)
                out[half, 2 * k + 1] = cutlass.select_(first, got, words[theirs])
        if row_ok:
            gQ = cute.zipped_divide(cute.recast_tensor(mQ, Int32), (1, 4))
            for half in cutlass.range_constexpr(2):
                cute.autovec_copy(out[half, None], gQ[(0, None), (row, 2 * half + lane)])
            for k in cutlass.range_constexpr(2):
                mS[row, 2 * lane + k] = Uint8(cutlass.select_(first, exps[k], exps[2 + k]))
