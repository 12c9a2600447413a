"""The epilogues of the grouped expert GEMM (kernels/moe/grouped_sm90.py, a mixin of GroupedSm90; `self.cfg`
is its GroupedConfig), per 64-row wave of a 64 x 256 tile split by column between two warpgroups:

swiglu (layer 1): the tile's 256 interleaved columns are 128 intermediates (gate at column c, up at
    c + 8: kernels/moe/expert_weights.interleave). gate / up rounded to bf16 (the reference's w1 / w3
    outputs), silu(min(g, 10)) · clamp(u, ±10) · route weight in fp32, h rounded to bf16, then the
    FP8 block of 128: amax over the quad that shares a row, exchanged between the two warpgroups in
    shared memory; e4m3 codes (2-byte pairs) into [rows, I] and one ue8m0 scale per row into the
    MN-major scales [G, I/128, Mg] (kernels/moe/dispatch.py's rule and layout).
bf16 (layer 2): bf16 pairs of adjacent columns as int32 stores into [rows, N].
Rows past a group's real rows (`limit`) are not stored.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint16

from kernels.bits import bits_f32
from kernels.fmha.softmax import quad_allreduce
from kernels.quant.numerics import bf16x2_bits, cute_abs, e4m3x2, inv_pow2, ue8m0_exponent
from kernels.regs import mn_view

LIMIT = 10.0  # spec §8.2
LOG2E = 1.4426950408889634
FP8_MAX, FP8_FLOOR = 448.0, 1e-4


@cute.jit
def bf16_half(pair: Int32, p: cutlass.Constexpr) -> Float32:
    """Value p of a `bf16x2_bits` pair (0: its first argument, the low half) as fp32."""
    return bits_f32((pair << 16) if p == 0 else (pair & Int32(-65536)))


@cute.jit
def swiglu(gate: Float32, up: Float32, rw: Float32, fast: cutlass.Constexpr) -> Float32:
    """silu(min(gate, 10)) · clamp(up, ±10) · route weight in fp32 (gate, up: the bf16 w1 / w3 outputs). fast: silu's
    division as g · rcp.approx(1 + 2^(−g·log2 e)) (MUFU.RCP + FMUL, within 1 ulp), else the IEEE division."""
    gv = cute.arch.fmin(gate, Float32(LIMIT))
    uv = cute.arch.fmax(cute.arch.fmin(up, Float32(LIMIT)), Float32(-LIMIT))
    if cutlass.const_expr(fast):
        silu = gv * cute.arch.rcp_approx(Float32(1.0) + cute.arch.exp2(gv * Float32(-LOG2E)))
    else:
        silu = gv / (Float32(1.0) + cute.arch.exp2(gv * Float32(-LOG2E)))
    return silu * uv * rw


class GroupedEpilogues:
    @cute.jit
    def _store_tile(self, accs, cC, st, bar, mRowW, mOut, mOutS, g, mt, nt, limit, mg, ctid):
        """A tile's epilogue (v2 and v3 alike): each 64-row wave's accumulator through the layer's epilogue."""
        c = self.cfg
        for w in cutlass.range_constexpr(c.waves):
            m0 = mt * c.bm + w * 64
            if cutlass.const_expr(c.epilogue == "swiglu"):
                self._store_h(accs[w], cC, st, bar, mRowW, mOut, mOutS, g, m0, nt, limit, mg, w, ctid)
            else:
                self._store_rows(accs[w], cC, mOut, g, m0, nt, limit, mg)

    @cute.jit
    def _store_h(self, acc, cC, st, bar, mRowW, mOut, mOutS, g, m0, nt, limit, mg, w, ctid):
        """Layer 1's epilogue for one 64-row wave (see the module docstring). `fast_silu` (v3,
        kernels/moe/grouped_split.py): silu's division is g · rcp.approx(1 + 2^(−g·log2 e)) (MUFU.RCP + FMUL;
        else the IEEE division, ~8 instructions, a slow-path branch and its convergence barrier an element)
        and each e4m3 pair goes out as one 2-byte store (else two 1-byte stores). rcp.approx is within 1 ulp;
        h is then rounded to bf16 as before."""
        fast = self.cfg.fast_silu
        acc_mn = mn_view(acc)
        n_r, n_c = cute.size(cC, mode=[0]), cute.size(cC, mode=[1])
        red = st.red.get_tensor(cute.make_layout((64, 2, self.cfg.waves)))
        if cutlass.const_expr(fast):  # h's codes as 2-byte e4m3 pairs
            out16 = cute.make_tensor(cute.recast_ptr(mOut.iterator, dtype=Uint16),
                                     cute.make_layout((mOut.shape[0], mOut.shape[1] // 2),
                                                      stride=(mOut.shape[1] // 2, 1)))
        half = ctid // 128  # the warpgroup's 128 columns: 64 intermediates
        h = cute.make_rmem_tensor((n_r, n_c // 2), Float32)
        for r in cutlass.range_constexpr(n_r):
            m = m0 + cC[r, 0][0]
            rw = Float32(0.0)
            if m < limit:
                rw = mRowW[g * mg + m]
            amax = Float32(0.0)
            for q in cutlass.range_constexpr(n_c // 4):
                gate = bf16x2_bits(acc_mn[r, 4 * q], acc_mn[r, 4 * q + 1])
                up = bf16x2_bits(acc_mn[r, 4 * q + 2], acc_mn[r, 4 * q + 3])
                for p in cutlass.range_constexpr(2):
                    h[r, 2 * q + p] = swiglu(bf16_half(gate, p), bf16_half(up, p), rw, fast)
                hb = bf16x2_bits(h[r, 2 * q], h[r, 2 * q + 1])  # the reference's bf16 h
                h[r, 2 * q], h[r, 2 * q + 1] = bf16_half(hb, 0), bf16_half(hb, 1)
                amax = cute.arch.fmax(amax, cute.arch.fmax(cute_abs(h[r, 2 * q]), cute_abs(h[r, 2 * q + 1])))
            amax = quad_allreduce(amax, cute.arch.fmax)
            if ctid % 4 == 0:
                red[cC[r, 0][0], half, w] = amax
        bar.arrive_and_wait()
        for r in cutlass.range_constexpr(n_r):
            row = cC[r, 0][0]
            m = m0 + row
            if m < limit:
                amax = cute.arch.fmax(red[row, 0, w], red[row, 1, w])
                exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP8_FLOOR)), 1.0 / FP8_MAX)
                inv = inv_pow2(exp)
                for q in cutlass.range_constexpr(n_c // 4):
                    col = cC[r, 4 * q][1]  # gate column of the pair: intermediate 8 (col // 16) + col % 8, even
                    i = nt * (self.cfg.bn // 2) + (col // 16) * 8 + col % 8
                    pair = e4m3x2(h[r, 2 * q] * inv, h[r, 2 * q + 1] * inv)
                    if cutlass.const_expr(fast):
                        out16[g * mg + m, i // 2] = Uint16(pair & 0xFFFF)
                    else:
                        mOut[g * mg + m, i] = Uint8(pair & 0xFF)
                        mOut[g * mg + m, i + 1] = Uint8((pair >> 8) & 0xFF)
                if (half == 0) & (ctid % 4 == 0):
                    mOutS[m, nt, g] = bits_f32(exp << 23)

    @cute.jit
    def _store_rows(self, acc, cC, mOut, g, m0, nt, limit, mg):
        """Layer 2's epilogue: bf16 pairs of adjacent columns as one int32 store each."""
        acc_mn = mn_view(acc)
        for r in cutlass.range_constexpr(cute.size(cC, mode=[0])):
            m = m0 + cC[r, 0][0]
            if m < limit:
                for q in cutlass.range_constexpr(cute.size(cC, mode=[1]) // 2):
                    col = nt * self.cfg.bn + cC[r, 2 * q][1]
                    if col // 2 < mOut.shape[1]:  # N a multiple of 128 only: the last tile's half past N
                        mOut[g * mg + m, col // 2] = bf16x2_bits(acc_mn[r, 2 * q], acc_mn[r, 2 * q + 1])
