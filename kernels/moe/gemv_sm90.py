"""CUDA-core (SIMT, no wgmma) decode path of the routed experts (issue #22; variant `cutedsl:gemv`): two
GEMV kernels that replace the grouped GEMMs L1 / L2 on the masked layout when every expert holds at most
`tmax` tokens (GemvConfig.tmax, a compile-time constant: 1, 2 or 4). No tensor core, so the same kernels
compile for sm_90a and sm_100a (the family's wgmma path is SM90-only).

Math (the reference's fp4_gemm: exact products, fp32 accumulation; oracles.moe routed_lowprec):
    L1: g = Σ_k w1[i, k] x[k], u = Σ_k w3[i, k] x[k] (x = e4m3 code x its per-128 ue8m0 scale, as dispatch
        wrote them) -> bf16 g, u -> silu(min(g, 10)) · clamp(u, ±10) · route weight (fp32) -> bf16 h
        (stored as bf16 [E · max_m, I]: the reference's h before its FP8 quantisation);
    L2: h's FP8 quantisation per 128 (ue8m0 scale, RNE e4m3: dispatch's rule), done by every L2 CTA for
        the tokens of its expert while loading them (a few KB from L2 cache), then y = Σ_k w2[d, k] h_q[k]
        -> bf16 rows [E · max_m, D], the layout combine reads (combine unchanged).
The quantisation of h moved from L1's epilogue to L2's prologue (same math, bit for bit) so that an L1
work unit can be 16 intermediates instead of a whole 128-wide quantisation block: at Flash T = 1 that is
768 units for the SMs instead of 96.

Weights: the checkpoint's own buffers (w1 / w3 [E, I, D/2], w2 [E, D, I/2] and their e8m0 scales
[E, N, K/32]): no load-time layout at all (the v2 interleave exists for the wgmma accumulator's
column pairs; a GEMV reads gate row i and up row i side by side from w1 and w3). The scales are the raw
ue8m0 bytes, so the decode is exact for every exponent (the v2 shift tables clamp past 13 binades).

Work: CTA = K/32 threads (K = the reduction: D for L1, I for L2), thread j owns the 32-wide K chunk j
(one MXFP4 sub-block: one 16-byte vector of codes and one scale byte a weight row), so its activations
stay in registers (32 x tmax fp32). A unit is (active expert, `pairs` row pairs: 16, or 8 / 4 where
gemv_layer.pick_pairs balances a small layer): L1 pairs (gate i, up i),
L2 pairs (row 2p, 2p + 1); `depth` pairs are in flight per thread (2 x 16 B each). Every CTA builds
the compact list of active experts (count > 0) with one warp's ballots, then takes a contiguous range
of units (consecutive units share an expert: the activations are reloaded only when it changes), so
empty experts cost nothing.

Per weight row a thread decodes its 32 codes exactly into fp32 (e2m1 bits placed at fp32 bits 22-24 and
31: the value times 2^-126, a subnormal for 0.5; FFMA keeps subnormals, nothing here is .ftz), FMAs them
with the tmax tokens' e4m3 values x 2^63 (products exact and normal), scales the chunk's sum by the
sub-block's 2^(e - 127) and the token's activation scale x 2^63, and the pair is reduced over the warp
(one exchange at lane distance 16 splits the pair, then 4 butterfly steps) and over the warps in
shared memory; the unit's epilogue runs on one thread per (row pair, token).
`emulate_layer` (kernels/moe/gemv_emulate.py) is this order in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernels.bits import bits_f32
from kernels.moe.grouped_config import MAX_GROUPS
from kernels.quant.numerics import bf16x2_bits, cute_abs, e4m3x2, inv_pow2, ue8m0_exponent

SUB = 32  # MXFP4 sub-block along K: one thread's chunk
QBLOCK = 128  # activation quantisation block along K
TMAXES = (1, 2, 4)
PAIRS = 16  # row pairs per work unit
LIMIT = 10.0  # spec §8.2
LOG2E = 1.4426950408889634
FP8_MAX, FP8_FLOOR = 448.0, 1e-4
X_BOOST = 63  # activations held as e4m3 value x 2^63: products with the 2^-126 weight values are normal
SIGN = -0x80000000
MAG = 0x01C00000  # fp32 bits 22-24: an e2m1 code's exponent (2 bits) and mantissa bit
K_ALIGN = 1024  # K = 32 threads x 32 a warp: whole warps a CTA
STAGES = ("l1", "l2")
# the shared-memory carveout (percent of the SM's maximum) the launch asks for: a CTA takes ~1-9 KB, the
# rest stays L1 (set explicitly: with a launch bound of more than one CTA an SM, CuTeDSL otherwise queries
# the device for its shared memory at compile time, which a CPU compile cannot)
SMEM_CARVEOUT = 50


@dataclass(frozen=True)
class GemvConfig:
    stage: str  # "l1" (w1 | w3 -> SwiGLU x route weight -> bf16 h) or "l2" (w2 on FP8(h) -> bf16 rows)
    n: int  # L1: intermediates I (row pairs: gate i, up i); L2: output rows D
    k: int  # the reduction: L1 D, L2 I
    tmax: int = 4  # tokens an expert may hold (compile-time: registers and FMAs per code)
    depth: int = 4  # row pairs in flight per thread
    min_ctas: int = 2  # __launch_bounds__ minimum CTAs an SM (the register cap)
    pairs: int = PAIRS  # row pairs a work unit (gemv_layer.pick_pairs: finer units balance small layers)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.tmax not in TMAXES:
            raise ValueError(f"tmax must be one of {TMAXES}, got {self.tmax}")
        if self.k % K_ALIGN:
            raise ValueError(f"K={self.k} must be a multiple of {K_ALIGN} (whole warps of 32-wide chunks)")
        rows = self.n if self.stage == "l1" else self.n // 2
        if self.pairs not in (4, 8, PAIRS):
            raise ValueError(f"pairs must be 4, 8 or {PAIRS}, got {self.pairs}")
        if rows % self.pairs or (self.stage == "l2" and self.n % 2):
            raise ValueError(f"N={self.n} must hold whole units of {self.pairs} row pairs")
        if self.pairs * self.tmax > self.threads:
            raise ValueError(f"{self.pairs} x tmax={self.tmax} epilogue threads exceed the CTA's {self.threads}")
        if not 1 <= self.depth <= self.pairs:
            raise ValueError(f"depth must be in 1..{self.pairs}, got {self.depth}")

    @property
    def threads(self) -> int:
        return self.k // SUB

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def units_per_expert(self) -> int:
        return (self.n if self.stage == "l1" else self.n // 2) // self.pairs


def e2m1_f32(w: Int32, c: int) -> Float32:
    """Code c (bits 4c..4c+3) of a word of 8 e2m1 codes -> its value x 2^-126 in fp32: the 3 magnitude bits
    at fp32 bits 22-24 (exponent field = the code's 2 exponent bits, mantissa bit 22 its mantissa bit: for
    exponent e > 0 that is 2^(e - 127)(1 + m/2) = value x 2^-126, for e = 0 the subnormal m · 2^-127, the
    same), the sign at bit 31. Codes 0-6: the nibble to the top (shift left), an arithmetic shift right
    by 6 puts the sign at 25-31 and the magnitude at 22-24, one AND keeps bits 31 and 22-24."""
    top = w if c == 7 else w << (28 - 4 * c)
    return bits_f32((top >> 6) & Int32(SIGN | MAG))


def e4m3_f32(b: Int32) -> Float32:
    """An e4m3 byte (bits 0-7 of b) -> its value x 2^-120 (the same subnormal-aligned placement: exponent
    field 0-15, mantissa bits 20-22); the caller multiplies by 2^120 · 2^63 in two exact steps."""
    return bits_f32(((b & 0x7F) << 20) | ((b & 0x80) << 24))


class GemvSm90:
    def __init__(self, cfg: GemvConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # L1: x codes e4m3 as int32 words (rows, D/4); L2: h bf16 as int32 pairs (rows, I/2)
        mXS: cute.Tensor,  # L1: x scales fp32 (Mg, D/128, E) (dispatch's masked layout); L2: unused (1, 1, 1)
        mWa: cute.Tensor,  # codes int32 words (E·N', K/8): L1 w1 (N' = I), L2 w2 (N' = D)
        mSa: cute.Tensor,  # ue8m0 scale bytes (E·N', K/32)
        mWb: cute.Tensor,  # L1: w3; L2: w2 again
        mSb: cute.Tensor,
        mCounts: cute.Tensor,  # int32 (E,)
        mRowW: cute.Tensor,  # route weight of each layout row fp32 (E·Mg,) (L1)
        mOut: cute.Tensor,  # int32 words (rows, N/2): L1 h as bf16 pairs (one bf16 stored a thread), L2 bf16 rows
        mg: Int32,  # max_m: rows a group
        n_ctas: Int32,
        stream,
    ):
        c = self.cfg

        @cute.struct
        class Storage:
            active: cute.struct.Align[cute.struct.MemRange[Int32, MAX_GROUPS + 1], 16]
            red: cute.struct.Align[cute.struct.MemRange[Float32, 2 * c.pairs * 2 * c.tmax * c.warps], 16]

        self.kernel(mX, mXS, mWa, mSa, mWb, mSb, mCounts, mRowW, mOut, mg, Storage).launch(
            grid=(n_ctas, 1, 1), block=[c.threads, 1, 1], min_blocks_per_mp=c.min_ctas, stream=stream,
            preferred_smem_carveout=SMEM_CARVEOUT)

    @cute.kernel
    def kernel(self, mX, mXS, mWa, mSa, mWb, mSb, mCounts, mRowW, mOut, mg, Storage: cutlass.Constexpr):
        c = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32
        st = cutlass.utils.SmemAllocator().allocate(Storage)
        active = st.active.get_tensor(cute.make_layout((MAX_GROUPS + 1,)))
        red = st.red.get_tensor(cute.make_layout((2, c.pairs, 2, c.tmax, c.warps)))

        # the compact list of active experts (one warp: a ballot per 32 experts), its length at [MAX_GROUPS]
        n_groups = mCounts.shape[0]
        if warp == 0:
            total = Int32(0)
            for base in cutlass.range(0, n_groups, 32, unroll=1):
                g = base + lane
                on = cutlass.Boolean(False)
                if g < n_groups:
                    on = mCounts[g] > 0
                bal = cute.arch.vote_ballot_sync(on)
                if on:
                    active[total + cute.arch.popc(bal & ((Int32(1) << lane) - 1))] = g
                total = total + cute.arch.popc(bal)
            if lane == 0:
                active[MAX_GROUPS] = total
        cute.arch.barrier()

        upe = c.units_per_expert
        units = active[MAX_GROUPS] * upe
        per = (units + gdim - 1) // gdim
        u0 = bidx * per
        u1 = cutlass.min(u0 + per, units)

        wa = cute.zipped_divide(mWa, (1, 4))  # 16-byte vectors: ((1, 4), (rows, K/32))
        wb = cute.zipped_divide(mWb, (1, 4))
        xr = cute.make_rmem_tensor((SUB, c.tmax), Float32)  # the thread's chunk of each token (x 2^63)
        xs = cute.make_rmem_tensor((c.tmax,), Float32)  # the chunk's activation scale x 2^63
        codes = cute.make_rmem_tensor(cute.make_layout((4, 2, c.depth), stride=(1, 4, 8)), Int32)
        scl = cute.make_rmem_tensor((2, c.depth), Int32)
        p = cute.make_rmem_tensor((2, c.tmax), Float32)
        cur = Int32(-1)  # the expert and the first token whose activations the registers hold
        cur_t0 = Int32(0)
        cnt = Int32(0)
        parity = Int32(0)
        for u in cutlass.range(u0, u1, unroll=1):
            e = active[u // upe]
            rb = u % upe
            total = cutlass.min(mCounts[e], mg)
            # chunks of tmax tokens: one, unless the expert holds more than tmax (then the unit's weight rows
            # are read again, from L2, for each further chunk: correct for any count, slower only there)
            for t0 in cutlass.range(0, total, c.tmax, unroll=1):
                if (e != cur) | (t0 != cur_t0):
                    cur = e
                    cur_t0 = t0
                    cnt = cutlass.min(total - t0, c.tmax)
                    self._load_x(mX, mXS, xr, xs, e, t0, cnt, mg, tidx)
                self._unit_sums(wa, wb, mSa, mSb, codes, scl, p, xr, xs, red, e, rb, parity, lane, warp, tidx)
                cute.arch.barrier()
                self._epilogue(red, mRowW, mOut, e, rb, t0, cnt, mg, parity, tidx)
                parity = 1 - parity

    @cute.jit
    def _unit_sums(self, wa, wb, mSa, mSb, codes, scl, p, xr, xs, red, e, rb, parity, lane, warp, tidx):
        """Unit rb of expert e against the tmax tokens in registers: each thread's 32-wide chunk of every
        row pair (`depth` pairs in flight), reduced over the warp into `red[parity]` (a slot per warp)."""
        c = self.cfg
        for d in cutlass.range_constexpr(min(c.depth, c.pairs)):
            self._load_pair(wa, wb, mSa, mSb, codes, scl, e, rb, d, d, tidx)
        for r in cutlass.range_constexpr(c.pairs):
            slot = r % c.depth
            p.fill(0.0)
            for h in cutlass.range_constexpr(2):
                for wi in cutlass.range_constexpr(4):
                    word = codes[wi, h, slot]
                    for q in cutlass.range_constexpr(8):
                        wv = e2m1_f32(word, q)
                        for t in cutlass.range_constexpr(c.tmax):
                            p[h, t] = p[h, t] + wv * xr[8 * wi + q, t]
            sa = scl[0, slot]
            sb = scl[1, slot]
            if cutlass.const_expr(r + c.depth < c.pairs):
                self._load_pair(wa, wb, mSa, mSb, codes, scl, e, rb, r + c.depth, slot, tidx)
            for t in cutlass.range_constexpr(c.tmax):
                ga = p[0, t] * self._pow2(sa) * xs[t]
                gb = p[1, t] * self._pow2(sb) * xs[t]
                # split the pair at lane distance 16 (lanes < 16 keep row a), then a butterfly of 4 steps
                low = lane < 16
                v = cutlass.select_(low, ga, gb) + cute.arch.shuffle_sync_bfly(cutlass.select_(low, gb, ga),
                                                                               offset=16)
                for off in cutlass.range_constexpr(4):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=8 >> off)
                if lane % 16 == 0:
                    red[parity, r, lane // 16, t, warp] = v

    @staticmethod
    def _pow2(s: Int32) -> Float32:
        """2^(s − 127) of a ue8m0 byte (s = 0: 2^-127, a subnormal)."""
        return bits_f32(cutlass.select_(s == 0, Int32(0x00400000), s << 23))

    @cute.jit
    def _load_pair(self, wa, wb, mSa, mSb, codes, scl, e, rb, r, slot, tidx):
        """Row pair r of unit rb: the thread's 16-byte chunk of both rows and their scale bytes into `slot`."""
        c = self.cfg
        if cutlass.const_expr(c.stage == "l1"):
            ra = e * c.n + rb * c.pairs + r
            rbb = ra
        else:
            ra = e * c.n + 2 * (rb * c.pairs + r)
            rbb = ra + 1
        cute.autovec_copy(wa[(0, None), (ra, tidx)], codes[None, 0, slot])
        cute.autovec_copy(wb[(0, None), (rbb, tidx)], codes[None, 1, slot])
        scl[0, slot] = Int32(mSa[ra, tidx])
        scl[1, slot] = Int32(mSb[rbb, tidx])

    @cute.jit
    def _load_x(self, mX, mXS, xr, xs, e, t0, cnt, mg, tidx):
        """The thread's 32-wide chunk of each of the expert's tokens, as value x 2^63 (0 past the count).
        L1: dispatch's e4m3 codes and scale. L2: h (bf16) quantised here per 128 (amax over the quad of
        threads that share the block; ue8m0 scale, RNE e4m3: dispatch's rule) and decoded back."""
        c = self.cfg
        xv = cute.zipped_divide(mX, (1, 4))
        words = cute.make_rmem_tensor((4, 4), Int32)
        for t in cutlass.range_constexpr(c.tmax):
            xs[t] = Float32(0.0)
            for k in cutlass.range_constexpr(SUB):
                xr[k, t] = Float32(0.0)
            if t < cnt:
                row = e * mg + t0 + t
                if cutlass.const_expr(c.stage == "l1"):
                    for v in cutlass.range_constexpr(2):  # 32 e4m3 bytes = 8 words
                        cute.autovec_copy(xv[(0, None), (row, 2 * tidx + v)], words[None, v])
                    for k in cutlass.range_constexpr(SUB):
                        b = (words[(k // 4) % 4, k // 16] >> (8 * (k % 4))) & 0xFF
                        xr[k, t] = e4m3_f32(b) * Float32(2.0**120) * Float32(2.0**X_BOOST)
                    xs[t] = mXS[t0 + t, tidx // 4, e] * Float32(2.0**X_BOOST)
                else:
                    for v in cutlass.range_constexpr(4):  # 32 bf16 = 16 words
                        cute.autovec_copy(xv[(0, None), (row, 4 * tidx + v)], words[None, v])
                    hv = cute.make_rmem_tensor((SUB,), Float32)
                    amax = Float32(0.0)
                    for k in cutlass.range_constexpr(SUB):
                        w = words[(k // 2) % 4, k // 8]
                        hv[k] = bits_f32((w << 16) if k % 2 == 0 else (w & Int32(-65536)))
                        amax = cute.arch.fmax(amax, cute_abs(hv[k]))
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2))
                    ex = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP8_FLOOR)), 1.0 / FP8_MAX)
                    inv = inv_pow2(ex)
                    for k in cutlass.range_constexpr(SUB // 2):
                        pair = e4m3x2(hv[2 * k] * inv, hv[2 * k + 1] * inv)
                        xr[2 * k, t] = e4m3_f32(pair) * Float32(2.0**120) * Float32(2.0**X_BOOST)
                        xr[2 * k + 1, t] = e4m3_f32(pair >> 8) * Float32(2.0**120) * Float32(2.0**X_BOOST)
                    xs[t] = bits_f32((ex + X_BOOST) << 23)

    @cute.jit
    def _epilogue(self, red, mRowW, mOut, e, rb, t0, cnt, mg, parity, tidx):
        """One thread per (row pair, token) of the unit: the warps' partial sums (in warp order), then L1's
        SwiGLU x route weight -> bf16 h, or L2's bf16 pair; stored as one int32 (L2: rows 2p, 2p + 1 of the
        token's output row) or one bf16 (L1: h[i])."""
        c = self.cfg
        if tidx < c.pairs * c.tmax:
            r = tidx % c.pairs
            t = tidx // c.pairs
            if t < cnt:
                a = red[parity, r, 0, t, 0]
                b = red[parity, r, 1, t, 0]
                for w in cutlass.range_constexpr(1, c.warps):
                    a = a + red[parity, r, 0, t, w]
                    b = b + red[parity, r, 1, t, w]
                row = e * mg + t0 + t
                if cutlass.const_expr(c.stage == "l1"):
                    gu = bf16x2_bits(a, b)  # the reference's bf16 w1 / w3 outputs
                    gv = cute.arch.fmin(bits_f32(gu << 16), Float32(LIMIT))
                    uv = cute.arch.fmax(cute.arch.fmin(bits_f32(gu & Int32(-65536)), Float32(LIMIT)), Float32(-LIMIT))
                    silu = gv / (Float32(1.0) + cute.arch.exp2(gv * Float32(-LOG2E)))
                    h = silu * uv * mRowW[row]
                    hb = bf16x2_bits(h, h)
                    out16 = cute.make_tensor(cute.recast_ptr(mOut.iterator, dtype=cutlass.Uint16),
                                             cute.make_layout((mOut.shape[0], 2 * mOut.shape[1]),
                                                              stride=(2 * mOut.shape[1], 1)))
                    out16[row, rb * c.pairs + r] = cutlass.Uint16(hb & 0xFFFF)
                else:
                    mOut[row, rb * c.pairs + r] = bf16x2_bits(a, b)


def gemv_kernel(cfg: GemvConfig) -> GemvSm90:
    return (GemvL1 if cfg.stage == "l1" else GemvL2)(cfg)


class GemvL1(GemvSm90):
    """L1 (its own class: the profiler's kernel name tells L1 from L2)."""


class GemvL2(GemvSm90):
    """L2: see GemvL1."""
