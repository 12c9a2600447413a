"""v5 of the grouped expert GEMM (decode, masked layout; GroupedConfig.swap_ab): swap-AB with the weights as the
A operand of an RS wgmma, out^T[weight rows, tokens] = W_e · x_e^T.

Why (docs/perf/moe.md "v5"): v2 / v4 widen the FP4 tile into shared memory, fence it for the async proxy and meet
at a CTA barrier every K block before the wgmma may read it; at decode that chain, not the weight stream, set a K
block's time (~1.4 us a CTA at any load). Here each consumer thread widens exactly the A-fragment registers its
own wgmma reads: the codes come in the load-time RS byte order (expert_weights.rs_byte_order: a thread's 32 codes
of a row are one 16-byte load), `widen8_rs` turns each 4-byte word into the fragment's two words. No widened tile,
no fence, no CTA barrier in the K loop; a warp frees a stage once its own wgmma of that stage has completed.

Tile: 256 weight rows (two consumer warpgroups x two m64 tiles) x bm tokens (16 or 32: the wgmma's N; x is the
B operand, K-major from the stage's 128B-swizzled tile). Per K block a thread widens 2 tiles x 2 rows x 32 codes
into one of two fragment sets (the next block's widening runs while this block's 8 wgmmas do), then waits and
promotes: acc += tmp · col_scale[row] · sa[token] (the weight's per-(row, K block) factor, x's per-(token, K
block) scale). Layer 1's 256 interleaved rows (kernels/moe/expert_weights.interleave) hold 128 intermediates,
gate in accumulator row r and up in r + 8 of one thread: h's FP8 block of 128 is the CTA's, its amax a shuffle
over the 8 lanes holding a token and one exchange between the 8 consumer warps. Layer 2 stores bf16 values.
GroupedSm90 (kernels/moe/grouped_sm90.py) runs the launch, the work list and the TMA warp; this class gives its
operands (`_operands`), the unit order (m tile fastest, `_unit`) and the consumers (`_consume`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Uint8, Uint16
from cutlass.cute.nvgpu import warpgroup
from cutlass.utils import LayoutEnum

from kernels.bits import bits_f32
from kernels.gemm.tiling import KBLOCK
from kernels.moe.grouped_config import MAX_GROUPS, WIDEN_TABLE_WORDS
from kernels.moe.grouped_epilogue import FP8_FLOOR, FP8_MAX, bf16_half, swiglu
from kernels.moe.grouped_sm90 import GroupedSm90
from kernels.moe.grouped_work import last_group
from kernels.moe.grouped_widen import SUBS, pair_offset, table_pair, widen8_rs
from kernels.quant.numerics import bf16x2_bits, cute_abs, e4m3x2, inv_pow2, ue8m0_exponent
from kernels.regs import fence_operand, mn_view

TILES = 2  # m64 tiles of weight rows per consumer warpgroup


class GroupedRs(GroupedSm90):
    def _operands(self, fp8) -> tuple:
        """RS wgmma of 64 weight rows x bm tokens a warpgroup, x's bm-token tiles as its B operand (K-major,
        128B-swizzled), no widened tiles (GroupedSm90.__call__ and .kernel run the rest: mB is the RS-ordered
        tiled codes (bn, 64, E·NT·KB))."""
        c = self.cfg
        kmaj = warpgroup.OperandMajorMode.K
        mma = lambda: sm90_utils.make_trivial_tiled_mma(  # noqa: E731
            fp8, fp8, kmaj, kmaj, Float32, (1, 1, 1), (64, c.bm), warpgroup.OperandSource.RMEM)
        return (mma(), mma(), sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (64, c.bm, KBLOCK), fp8,
                                                              c.n_stages), None)

    @cute.jit
    def _unit(self, u, tiles_n, n_groups, mg, mGroup, st):
        """Unit u -> (group, m tile, n tile, expert, real rows), v5's order: (group, n tile, m tile), m tile fastest
        (v2: n tile fastest). An expert's token tiles of one weight tile go to neighbouring CTAs, which run at
        the same time: one reads the weight tile from DRAM, the others mostly from L2. The group holding u: the
        last whose first unit gfirst · tiles_n is <= u (empty groups own no unit)."""
        gt = st.gtiles.get_tensor(cute.make_layout((MAX_GROUPS,)))
        gf = st.gfirst.get_tensor(cute.make_layout((MAX_GROUPS,)))
        lo = last_group(gf, n_groups, u, tiles_n)
        local = u - gf[lo] * tiles_n
        return lo, local % gt[lo], local // gt[lo], lo, cutlass.min(mGroup[lo], mg)

    @cute.jit
    def _consume(self, ring, tiled_mma, mma_acc, sX, _sB, sSh, sSW, sSA, st, mTab, mGroup, mRowW, mOut, mOutS,
                 n_groups, tiles_n, n_kb, units, mg, bidx, gdim, ctid, split):
        """The consumer warpgroups (GroupedSm90.kernel calls it): per unit, the K loop in pairs of blocks (the
        fragment sets alternate), then the layer's epilogue. sX: x's stage tiles (the B operand). split: (workspace,
        counters, units run whole, slices of each tail unit); with split_k, per item (a whole unit, or a tail unit's K
        slice) its blocks; a slice adds its partial into the unit's workspace tile and only the last one to arrive runs
        the epilogue (grouped_slices)."""
        c = self.cfg
        codes = st.sQ.data_ptr()  # the stages' FP4 tiles (RS byte order)
        tab = st.tab.get_tensor(cute.make_layout((WIDEN_TABLE_WORDS,)))
        if ctid < WIDEN_TABLE_WORDS:
            tab[ctid] = mTab[ctid]
        thr = tiled_mma.get_slice(ctid % 128)
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sX))  # (frag, 1, 4 k steps, stages)
        a_shape = thr.partition_shape_A((64, KBLOCK))  # ((4, 2, 2), 1, 4): 16 e4m3 bytes a k step
        frags = [[cute.make_rmem_tensor(a_shape, sX.element_type) for _ in range(TILES)] for _ in range(2)]
        acc_shape = thr.partition_shape_C((64, c.bm))
        accs = [cute.make_rmem_tensor(acc_shape, Float32) for _ in range(TILES)]
        tmps = [cute.make_rmem_tensor(acc_shape, Float32) for _ in range(TILES)]
        row_sc = cute.make_rmem_tensor((TILES, 2), Float32)  # row frame: the weight rows' scales (`_kblock_rs`)
        sink = None  # knock-outs without wgmmas only: the fragments' XOR, so that the widening stays live
        if cutlass.const_expr(c.skips_mma):
            sink = cute.make_rmem_tensor((1,), Int32)
            sink[0] = Int32(0)
        cC = mn_view(thr.partition_C(cute.make_identity_tensor((64, c.bm))))
        # the thread's first weight row of tile j: wg_rows + 64 j (+ 8 for the fragment's second row)
        wg_rows = cute.arch.make_warp_uniform(ctid // 128) * (TILES * 64) + cC[0, 0][0]
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * c.n_mma_wg)
        bar.arrive_and_wait()  # the table is in
        workspace, _count, full, slices = split
        g_rd = Int32(0)
        for w in cutlass.range(bidx, full + (units - full) * slices, gdim, unroll=1):
            u, kb0, kb1, slot = self._item(w, (full, slices), n_kb)
            nk = kb1 - kb0
            g, mt, nt, e, limit = self._unit(u, tiles_n, n_groups, mg, mGroup, st)
            rws = None  # L1: the route weights of the tile's tokens (GroupedConfig.route_first: read here, not after)
            if cutlass.const_expr(c.route_first):
                rws = self._route_weights(cC, mRowW, g, mt, limit, mg)
            for j in cutlass.range_constexpr(TILES):
                accs[j].fill(0.0)
            self._widen_a(ring, codes, sSh, tab, frags[0], g_rd, wg_rows, ctid)
            first = (w == bidx) & (ctid == 0)  # GroupedConfig.stamps: the CTA's first item, one thread
            if cutlass.const_expr(c.stamps):
                if first:
                    self._stamp(workspace, bidx, "first_full")
            for p in cutlass.range(0, nk // 2, unroll=1):
                self._kblock_rs(ring, (tiled_mma, mma_acc), frags[0], frags[1], True, tCrB, accs, tmps, cC, codes, sSh,
                                sSW, sSA, tab, g_rd + 2 * p, wg_rows, ctid, row_sc, sink)
                self._kblock_rs(ring, (tiled_mma, mma_acc), frags[1], frags[0], 2 * p + 2 < nk, tCrB, accs, tmps,
                                cC, codes, sSh, sSW, sSA, tab, g_rd + 2 * p + 1, wg_rows, ctid, row_sc, sink)
            if nk % 2 == 1:
                self._kblock_rs(ring, (tiled_mma, mma_acc), frags[0], frags[1], False, tCrB, accs, tmps, cC, codes, sSh,
                                sSW, sSA, tab, g_rd + nk - 1, wg_rows, ctid, row_sc, sink)
            g_rd = g_rd + nk
            if cutlass.const_expr(c.skips_mma):  # a use of the sink the compiler cannot drop
                if sink[0] == Int32(0x5EED5EED):
                    accs[0][0] = Float32(1.0)
            if cutlass.const_expr(c.stamps):
                if first:
                    self._stamp(workspace, bidx, "loop_done")
            if cutlass.const_expr(c.split_k > 1):
                if self._holds_sum(accs, split, st, bar, w, slot, ctid):
                    self._epilogue_rs(accs, cC, row_sc, st, bar, (rws, mRowW), mOut, mOutS, g, mt, nt, limit, mg,
                                      wg_rows, ctid)
            else:
                self._epilogue_rs(accs, cC, row_sc, st, bar, (rws, mRowW), mOut, mOutS, g, mt, nt, limit, mg, wg_rows,
                                  ctid)
            if cutlass.const_expr(c.stamps):
                if ctid == 0:  # the last item's epilogue stamps last
                    self._stamp(workspace, bidx, "exit")

    @cute.jit
    def _route_weights(self, cC, mRowW, g, mt, limit, mg):
        """L1: the route weight of each of the thread's token columns (0 past the expert's count)."""
        n_c = cute.size(cC, mode=[1])
        rws = cute.make_rmem_tensor((n_c,), Float32)
        for cc in cutlass.range_constexpr(n_c):
            m = mt * self.cfg.bm + cC[0, cc][1]
            rws[cc] = Float32(0.0)
            if m < limit:
                rws[cc] = mRowW[g * mg + m]
        return rws

    @cute.jit
    def _epilogue_rs(self, accs, cC, row_sc, st, bar, route, mOut, mOutS, g, mt, nt, limit, mg, wg_rows, ctid):
        """A unit's accumulators out: the weight rows' scale (row frame: the same in every K block, so once a unit
        and after a split's sum), then L1's SwiGLU x route weight + h quantisation or L2's bf16 rows. route: (the
        route weights read at the unit's start (route_first) or None, the rows' route weights in global memory)."""
        c = self.cfg
        if cutlass.const_expr(c.row_frame):
            for j in cutlass.range_constexpr(TILES):
                acc_mn = mn_view(accs[j])
                for r in cutlass.range_constexpr(2):
                    for cc in cutlass.range_constexpr(cute.size(cC, mode=[1])):
                        acc_mn[r, cc] = acc_mn[r, cc] * row_sc[j, r]
        if cutlass.const_expr(c.epilogue == "swiglu"):
            rws, mRowW = route
            if cutlass.const_expr(rws is None):
                rws = self._route_weights(cC, mRowW, g, mt, limit, mg)
            self._store_h_rs(accs, cC, st, bar, rws, mOut, mOutS, g, mt, nt, limit, mg, wg_rows, ctid)
        else:
            self._store_rows_rs(accs, cC, mOut, g, mt, nt, limit, mg, wg_rows)

    @cute.jit
    def _widen_a(self, ring, codes, sSh, tab, frag, g_rd, wg_rows, ctid):
        """Wait for K block g_rd's stage, then widen the thread's A fragments of it into `frag` (one per m64
        tile): per row one 16-byte load of its RS-ordered codes and its shift word, per sub-block s (= k step
        s) a table pair and `widen8_rs`: word s -> the fragment's words (row half, k half 0) and (row half, 1)."""
        c = self.cfg
        state = self._stage(g_rd)
        ring.consumer_wait(state)
        q4 = cute.make_tensor(cute.recast_ptr(codes, dtype=Int32),
                              cute.make_layout((4, c.n_stages * c.bn * 4), stride=(1, 4)))
        words = cute.make_rmem_tensor(cute.make_layout((4, 2 * TILES), stride=(1, 4)), Int32)
        shifts = cute.make_rmem_tensor((2 * TILES,), Int32)
        quad = ctid % 4
        for j in cutlass.range_constexpr(TILES):
            for rh in cutlass.range_constexpr(2):
                row = wg_rows + 64 * j + 8 * rh
                cute.autovec_copy(q4[None, (state.index * c.bn + row) * 4 + quad], words[None, 2 * j + rh])
                if cutlass.const_expr(not c.skips_widen):
                    shifts[2 * j + rh] = sSh[row, 0, state.index]
        for j in cutlass.range_constexpr(TILES):
            out = cute.recast_tensor(frag[j], Int32)  # word rh + 2 kh + 4 s
            for rh in cutlass.range_constexpr(2):
                for s in cutlass.range_constexpr(SUBS):
                    if cutlass.const_expr(c.skips_widen):  # knock-out: the code words as they came
                        out[rh + 4 * s] = words[s, 2 * j + rh]
                        out[rh + 2 + 4 * s] = words[s, 2 * j + rh]
                        continue
                    pair = cute.make_rmem_tensor((2,), Int32)
                    cute.autovec_copy(table_pair(tab, pair_offset(shifts[2 * j + rh], s)), pair)
                    lo, hi = widen8_rs(words[s, 2 * j + rh], pair[0], pair[1])
                    out[rh + 4 * s] = lo
                    out[rh + 2 + 4 * s] = hi

    @cute.jit
    def _kblock_rs(self, ring, mmas, cur, nxt, has_next, tCrB, accs, tmps, cC, codes, sSh, sSW, sSA, tab, g_rd,
                   wg_rows, ctid, row_sc, sink):
        """K block g_rd (its fragments widened into `cur`): 4 k steps x 2 tiles of RS wgmma into tmps, one group;
        the promotion's scale products read from the stage while they run, then (has_next) the next block's
        stage widened into `nxt`; wait, free the stage, promote. row_sc: the row frame's weight-row scales; sink: the
        no-mma knock-out XORs `cur` into it (16 LOP3 a block) so that the widening is not dead code."""
        c = self.cfg
        state = self._stage(g_rd)
        for j in cutlass.range_constexpr(TILES):
            fence_operand(tmps[j])
            fence_operand(cur[j])
        warpgroup.fence()
        if cutlass.const_expr(not c.skips_mma):
            for j in cutlass.range_constexpr(TILES):
                for k in cutlass.range_constexpr(SUBS):
                    cute.gemm(mmas[0] if k == 0 else mmas[1], tmps[j], cur[j][(None, None, k)],
                              tCrB[(None, None, k, state.index)], tmps[j])
        else:  # the knock-out issues none (what the tensor pipe costs); its fragments go to the sink
            for j in cutlass.range_constexpr(TILES):
                words = cute.recast_tensor(cur[j], Int32)
                for i in cutlass.range_constexpr(cute.size(words)):
                    sink[0] = sink[0] ^ words[i]
        warpgroup.commit_group()
        n_c = cute.size(cC, mode=[1])
        # the promotion's factors, read while the wgmmas run: block frame, sw[row] · sa[token] (TILES x 2 rows x n_c);
        # row frame (GroupedConfig.row_frame), sa[token] alone, the weight rows' scales (the same in every K block)
        # kept in row_sc and applied once a unit (`_consume`)
        rows = 1 if self.cfg.row_frame else 2 * TILES
        prod = cute.make_rmem_tensor((rows, n_c), Float32)
        for j in cutlass.range_constexpr(TILES):
            for r in cutlass.range_constexpr(2):
                sw = sSW[wg_rows + 64 * j + 8 * r, 0, state.index]
                if cutlass.const_expr(self.cfg.row_frame):
                    row_sc[j, r] = sw
                else:
                    for cc in cutlass.range_constexpr(n_c):
                        prod[2 * j + r, cc] = sw * sSA[cC[0, cc][1], 0, state.index]
        if cutlass.const_expr(self.cfg.row_frame):
            for cc in cutlass.range_constexpr(n_c):
                prod[0, cc] = sSA[cC[0, cc][1], 0, state.index]
        if has_next:
            self._widen_a(ring, codes, sSh, tab, nxt, g_rd + 1, wg_rows, ctid)
        warpgroup.wait_group(0)
        ring.consumer_release(state)
        for j in cutlass.range_constexpr(TILES):
            fence_operand(tmps[j])
            acc_mn, tmp_mn = mn_view(accs[j]), mn_view(tmps[j])
            for r in cutlass.range_constexpr(2):
                for cc in cutlass.range_constexpr(n_c):
                    acc_mn[r, cc] = acc_mn[r, cc] + tmp_mn[r, cc] * prod[0 if rows == 1 else 2 * j + r, cc]

    @cute.jit
    def _store_h_rs(self, accs, cC, st, bar, rws, mOut, mOutS, g, mt, nt, limit, mg, wg_rows, ctid):
        """Layer 1's epilogue (grouped_epilogue's math, transposed): per token column the thread's 2 tiles give
        h of 2 intermediates (gate row r, up row r + 8); the token's amax over the CTA's 128 intermediates is a
        shuffle over the 8 lanes of the token's quad position, then one word per consumer warp in shared
        memory. Codes [rows, I] as single bytes, one ue8m0 scale per token (warp 0's lanes 0-3)."""
        fast = self.cfg.fast_silu
        n_c = cute.size(cC, mode=[1])
        warps = 4 * self.cfg.n_mma_wg
        red = st.red.get_tensor(cute.make_layout((self.cfg.bm, warps), stride=(warps, 1)))
        warp = ctid // 32
        h = cute.make_rmem_tensor((TILES, n_c), Float32)
        for j in cutlass.range_constexpr(TILES):
            acc_mn = mn_view(accs[j])
            for q in cutlass.range_constexpr(n_c // 2):
                gate = bf16x2_bits(acc_mn[0, 2 * q], acc_mn[0, 2 * q + 1])  # tokens 2q, 2q + 1 (columns)
                up = bf16x2_bits(acc_mn[1, 2 * q], acc_mn[1, 2 * q + 1])
                for p in cutlass.range_constexpr(2):
                    h[j, 2 * q + p] = swiglu(bf16_half(gate, p), bf16_half(up, p), rws[2 * q + p], fast)
                hb = bf16x2_bits(h[j, 2 * q], h[j, 2 * q + 1])  # the reference's bf16 h
                h[j, 2 * q], h[j, 2 * q + 1] = bf16_half(hb, 0), bf16_half(hb, 1)
        for cc in cutlass.range_constexpr(n_c):
            amax = cute.arch.fmax(cute_abs(h[0, cc]), cute_abs(h[1, cc]))
            for off in cutlass.range_constexpr(3):
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=4 << off))
            if ctid % 32 < 4:
                red[cC[0, cc][1], warp] = amax
        bar.arrive_and_wait()
        for cc in cutlass.range_constexpr(n_c):
            tok = cC[0, cc][1]
            m = mt * self.cfg.bm + tok
            amax = red[tok, 0]
            for w in cutlass.range_constexpr(1, warps):
                amax = cute.arch.fmax(amax, red[tok, w])
            if m < limit:
                exp = ue8m0_exponent(cute.arch.fmax(amax, Float32(FP8_FLOOR)), 1.0 / FP8_MAX)
                inv = inv_pow2(exp)
                pair = e4m3x2(h[0, cc] * inv, h[1, cc] * inv)
                for j in cutlass.range_constexpr(TILES):
                    tr = wg_rows + 64 * j  # gate row of intermediate 8 (tr // 16) + tr % 16 of the tile
                    i = nt * (self.cfg.bn // 2) + (tr // 16) * 8 + tr % 16
                    mOut[g * mg + m, i] = Uint8((pair >> (8 * j)) & 0xFF)
                if ctid < 4:
                    mOutS[m, nt, g] = bits_f32(exp << 23)
        bar.arrive_and_wait()  # `red` is read before the next tile's epilogue writes it

    @cute.jit
    def _store_rows_rs(self, accs, cC, mOut, g, mt, nt, limit, mg, wg_rows):
        """Layer 2's epilogue: the bf16 value of (token, weight row) as one 2-byte store; rows past N are not
        stored (N a multiple of 128 only: the last tile's half)."""
        n = mOut.shape[1] * 2
        out16 = cute.make_tensor(cute.recast_ptr(mOut.iterator, dtype=Uint16),
                                 cute.make_layout((mOut.shape[0], n), stride=(n, 1)))
        n_c = cute.size(cC, mode=[1])
        for j in cutlass.range_constexpr(TILES):
            acc_mn = mn_view(accs[j])
            for r in cutlass.range_constexpr(2):
                row = nt * self.cfg.bn + wg_rows + 64 * j + 8 * r
                for q in cutlass.range_constexpr(n_c // 2):
                    bits = bf16x2_bits(acc_mn[r, 2 * q], acc_mn[r, 2 * q + 1])  # token 2q low, 2q + 1 high
                    for p in cutlass.range_constexpr(2):
                        m = mt * self.cfg.bm + cC[0, 2 * q + p][1]
                        if (m < limit) & (row < n):
                            out16[g * mg + m, row] = Uint16((bits >> (16 * p)) & 0xFFFF)


class GroupedL1Rs(GroupedRs):
    """Layer 1 of v5 (the profiler's kernel name tells it from v2's GroupedL1)."""


class GroupedL2Rs(GroupedRs):
    """Layer 2 of v5."""
