"""FP8 sparse decode, stage 1: gather each request's selected tokens from the two FlashMLA FP8 caches
(the window cache and the compressed cache, oracles/fmha_cache.py: the MODEL1 layout) and
dequantise them into a bf16 key buffer W [b, n_pad, 512] plus its index list Widx [b, n_pad].

Slot j of request r is slot j of cache 0's list (j < k0), else slot j - k0 of cache 1's list; a slot
is read when it is below its list's length and its index is in [0, tokens). W[r, j] is the dequantised
token; Widx[r, j] = j, or -1 where the slot is not read. The attention kernel (kernel_sm90.py)
then walks Widx as its per-row index lists over W, and an invalid slot makes it read row 0 with a
masked score: row 0 must be finite, so an unread slot 0 is zero-filled (other unread rows are never
read, never written).

One warp per slot: the 512 outputs are 64 units of 8 values; lane l does units l and l + 32. Units
0-55 are NoPE codes (8 e4m3 bytes, times the tile's ue8m0 scale 2^(e - 127)), units 56-63 copy
the bf16 RoPE values.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.runtime import make_fake_tensor

from kernels.bits import bits_f32

WARPS = 8  # slots per CTA
UNIT = 8  # values per unit
NOPE_UNITS = 448 // UNIT  # 56
UNITS_PER_TILE = 64 // UNIT  # a scale covers 8 units


class DequantGather:
    """Compile-time nothing; runtime: both caches' shapes, list widths, requests, W's width."""

    @cute.jit
    def __call__(self, codes0, rope0, sc0, idx0, len0, codes1, rope1, sc1, idx1, len1,
                 mW: cute.Tensor, mWidx: cute.Tensor, stream):
        self.kernel(codes0, rope0, sc0, idx0, len0, codes1, rope1, sc1, idx1, len1, mW, mWidx).launch(
            grid=[cute.ceil_div(mW.shape[1], WARPS), mW.shape[0], 1], block=[32 * WARPS, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel(self, codes0, rope0, sc0, idx0, len0, codes1, rope1, sc1, idx1, len1,
               mW: cute.Tensor, mWidx: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, r, _ = cute.arch.block_idx()
        lane = tidx % 32
        j = bx * WARPS + tidx // 32
        k0 = idx0.shape[1]
        if j < mW.shape[1]:
            ok = False
            if j < k0:
                ok = self._slot(codes0, rope0, sc0, idx0, len0, r, j, mW, j, lane)
            elif j < k0 + idx1.shape[1]:
                ok = self._slot(codes1, rope1, sc1, idx1, len1, r, j - k0, mW, j, lane)
            widx = Int32(-1)
            if ok:
                widx = j
            if lane == 0:
                mWidx[r, j] = widx
            if j == 0 and not ok:
                zero = cute.make_rmem_tensor((UNIT,), BFloat16)
                zero.fill(0.0)
                for half in cutlass.range_constexpr(2):
                    cute.autovec_copy(zero, cute.local_tile(mW[r, 0, None], (UNIT,), (lane + 32 * half,)))

    @cute.jit
    def _slot(self, codes, rope, sc, idx, lens, r, slot, mW, j, lane):
        """Dequantise token idx[r, slot] of one cache into W[r, j] when the slot is read; returns
        whether it is."""
        bs = codes.shape[1]
        v = idx[r, slot]
        ok = slot < lens[r] and v >= 0 and v < codes.shape[0] * bs
        if ok:
            blk, tok = v // bs, v % bs
            dst = mW[r, j, None]
            for half in cutlass.range_constexpr(2):
                u = lane + 32 * half
                if u < NOPE_UNITS:
                    raw = cute.make_rmem_tensor((UNIT,), codes.element_type)
                    cute.autovec_copy(cute.local_tile(codes[blk, tok, None], (UNIT,), (u,)), raw)
                    e = Int32(sc[blk, tok, u // UNITS_PER_TILE])
                    s = bits_f32(e << 23)  # ue8m0: 2^(e - 127) (e = 0 would be 2^-127; the quantiser never writes it)
                    vals = cute.make_rmem_tensor((UNIT,), BFloat16)
                    vals.store((raw.load().to(Float32) * s).to(BFloat16))
                    cute.autovec_copy(vals, cute.local_tile(dst, (UNIT,), (u,)))
                else:
                    vals = cute.make_rmem_tensor((UNIT,), BFloat16)
                    cute.autovec_copy(cute.local_tile(rope[blk, tok, None], (UNIT,), (u - NOPE_UNITS,)), vals)
                    cute.autovec_copy(vals, cute.local_tile(dst, (UNIT,), (u,)))
        return ok


def fake_args() -> tuple:
    """Fake tensors of both caches' views (oracles/fmha_cache.cache_views), their lists and lengths,
    W and Widx: runtime sizes; the token strides (576 bytes, 8 scale bytes) are fixed by the layout."""
    b, n_pad = cute.sym_int32(), cute.sym_int32()

    def cache():
        nb, bs, k = (cute.sym_int32() for _ in range(3))
        blk = cute.sym_int64(divisibility=16)
        codes = make_fake_tensor(cutlass.Float8E4M3FN, (nb, bs, 448), (blk, 576, 1), assumed_align=16)
        rope = make_fake_tensor(BFloat16, (nb, bs, 64), (cute.sym_int64(divisibility=8), 288, 1), assumed_align=16)
        sc = make_fake_tensor(cutlass.Uint8, (nb, bs, 8), (cute.sym_int64(divisibility=8), 8, 1), assumed_align=8)
        idx = make_fake_tensor(Int32, (b, k), (cute.sym_int64(), 1), assumed_align=4)
        lens = make_fake_tensor(Int32, (b,), (1,), assumed_align=4)
        return codes, rope, sc, idx, lens

    w = make_fake_tensor(BFloat16, (b, n_pad, 512), (cute.sym_int64(divisibility=8), 512, 1), assumed_align=16)
    widx = make_fake_tensor(Int32, (b, n_pad), (cute.sym_int64(), 1), assumed_align=4)
    return (*cache(), *cache(), w, widx)
