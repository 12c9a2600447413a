"""v12, the default sparse prefill (`cutedsl`; the key split, dv = 512, V = K: every DSV4 shape), issue
#25: the fixed cost per CTA (Q's load, the epilogue) and the gather's per-tile cost, each a subclass of
v10 (GatherAttentionSm90, `cutedsl:v10`) that overrides one seam. On the H100, v11 was 1.19-1.29x v10 on
the DSV4 prefills at s_q 4096 and 16384 (docs/perf/fmha.md, "v11"); each change alone is an A/B form:

  QFirst     (`cutedsl:q-first`)     Q by one TMA (8 boxes of 64 heads x 64 d, issued by producer
                                     warp 0, one arrive.expect_tx on q_full) instead of 32 cp.async a
                                     producer thread queued ahead of the first K tile's gather: Q
                                     streams in beside the first pair's rows.
  EpiTma     (`cutedsl:epi-tma`)     O normalised in registers, stmatrix into the Q buffer and one TMA
                                     store per warpgroup (its half of d), behind one 128-thread barrier
                                     of its own; no CTA-wide barrier (the key split's row-sum exchange
                                     already orders every QK read of sQ before any O write).
  GatherHint (`cutedsl:gather-hint`) the pair's K rows by `cp.async.cg ... L2::cache_hint` (an
                                     evict_last policy), src-size 0 (zero fill, no read) for invalid
                                     slots, one shared-memory base a thread plus immediates.
  V11        (`cutedsl:v11`)         all three.
  V12        (`cutedsl`, the default) V11 storing O a 64-column tile at a time (FlashMLA's order), still
                                     waiting for the boxes' reads before the CTA exits.
  SpinWait   (`cutedsl:spin-wait`)   V11 with the key split's stage waits polled without a suspend
                                     hint (measured: no change within the noise; docs/perf/fmha.md).

Each applies where its preconditions hold at compile time and is v10's code elsewhere: per-token
lists with the key split, a CTA's rows whole heads of one kv group: 64-head blocks (hpg % 64 == 0: Flash 64,
Pro 128) or a TP split's hpg < 64 heads, hpg <= 16 or a multiple of 16 (O boxes of hpg rows); `_v11_applies`. The
TMA store needs the whole heads (a box past a group's last head would write the next group's rows): hpg 96 keeps
v10's code.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.config import LN2, LOG2E
from kernels.fmha.kernel_sm90 import GatherAttentionSm90
from kernels.l2_policy import l2_policy
from kernels.fmha.softmax import quad_allreduce
from kernels.regs import mn_view

EPI_WG0 = int(NamedBarrier.EPI_WG0)


@dsl_user_op
def cp_async_16_hint(smem_addr, gmem_addr, src_bytes, policy, smem_imm: int, gmem_imm: int, *, loc=None,
                     ip=None) -> None:
    """cp.async.cg of 16 bytes from [gmem_addr + gmem_imm] to shared [smem_addr + smem_imm], tagged with
    an L2 cache policy; src_bytes < 16 zero-fills the rest (0: no global read at all)."""
    llvm.inline_asm(
        None,
        [Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip),
         Int32(src_bytes).ir_value(loc=loc, ip=ip), Int64(policy).ir_value(loc=loc, ip=ip)],
        f"cp.async.cg.shared.global.L2::cache_hint [$0+{smem_imm}], [$1+{gmem_imm}], 16, $2, $3;",
        "r,l,r,l", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def swizzled_k_offset(row: int, chunk: int, d: int) -> int:
    """Byte offset of 16-byte chunk `chunk` of key row `row` in one K stage (64 keys, d; K-major SW128
    atoms of 8 rows x 128 bytes, the 64 rows of one 128-byte column block after another): the formula
    GatherHint's addressing assumes. tests/fmha/test_fmha_v11.py checks it against CuTe's layout."""
    seg, j = divmod(chunk, 8)
    return seg * 64 * 128 + row * 128 + ((j ^ (row % 8)) * 16)


class V11Base(GatherAttentionSm90):
    """What v11 and its single-change forms share: where they apply, and their TMA atoms (`_io_tma`)."""

    q_by_tma = False
    o_by_tma = False
    o_tile_cols = 0  # the O store's tile width; 0: a warpgroup's half of d at once (V12: 64)

    def _v11_applies(self) -> bool:
        """Per-token lists with the key split, where a CTA's rows are whole heads of one kv group: 64-head
        blocks (hpg % 64 == 0: Flash 64, Pro 128) or the group's hpg < 64 heads (TP splits: Pro 16, Flash 8 at
        TP 8; an O box of hpg rows), hpg <= 16 or a multiple of 16 (an O box of 20, 24 or 40 rows aborted the
        compiler). Elsewhere (hpg 96: a block past its group) the shipped code."""
        c = self.cfg
        split = c.hpg < 64 and (c.hpg <= 16 or c.hpg % 16 == 0)
        return c.key_split and c.per_token_idx and (c.hpg % 64 == 0 or split)

    def _q_tma(self) -> bool:
        return self.q_by_tma and self._v11_applies()

    def _o_tma(self) -> bool:
        return self.o_by_tma and self._v11_applies()

    def _o_cols(self) -> int:
        """Columns of O a TMA store tile takes: a warpgroup's half of d in one (v11), or `o_tile_cols` a tile."""
        return self.o_tile_cols or self.cfg.dv_wg

    def _io_tma(self, mQ, mO, sQ_layout):
        """(Q load atom, Q coordinates, O store atom, O coordinates), the unused pair None; or None.
        Q and O as (heads, d, tokens, batch): one item's tile is 64 heads x d of one token."""
        if not (self._q_tma() or self._o_tma()):
            return None
        c = self.cfg
        sQ_2d = cute.slice_(sQ_layout, (None, None, 0))
        q = (None, None)
        o = (None, None)
        if self._q_tma():
            mQ_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[1, 2, 0, 3]))
            q = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mQ_t, sQ_2d, (c.m_cta, c.d))
        if self._o_tma():
            mO_t = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[1, 2, 0, 3]))
            # one O store tile: the (hb, `_o_cols`) slice of the Q buffer's layout (v11: a warpgroup's half of d);
            # hb rows, the CTA's heads (64, or a TP split's hpg: the box must not write the next group's rows)
            cols = self._o_cols()
            sO_tile = cute.slice_(cute.zipped_divide(sQ_2d, (c.hb, cols)), ((None, None), (0, 0)))
            o = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO_t, sO_tile, (c.hb, cols))
        return (*q, *o)


class QFirst(V11Base):
    q_by_tma = True

    def _q_full_arrivals(self) -> int:
        """One arrival (the TMA's arrive.expect_tx) when Q comes by TMA, else the shipped kernel's."""
        return 1 if self._q_tma() else GatherAttentionSm90._q_full_arrivals(self)

    @cute.jit
    def _load_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full):
        """Producer warp 0: the item's 64 x d Q tile by TMA (heads past h_q arrive as zeros; rows of
        another kv group are read and never stored), evict_first; the other producer warps go straight
        on to the first pair's gather. TMA writes are the async proxy's: the wgmma reads need no fence."""
        if cutlass.const_expr(not self._q_tma()):
            GatherAttentionSm90._load_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full)
        else:
            c = self.cfg
            tma_q, mQ_c = io[0], io[1]
            if ptid < 32:  # the whole warp: the copy elects its issuing lane (lesson 18)
                g = cute.local_tile(cute.domain_offset((head0, 0), mQ_c[None, None, tok0, bidx]), (c.m_cta, c.d),
                                    (0, 0))
                t_s, t_g = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                                 cute.group_modes(g, 0, 2))
                if cute.arch.lane_idx() == 0:
                    cute.arch.mbarrier_arrive_and_expect_tx(q_full, c.m_cta * c.d * 2)
                cute.copy(tma_q, t_g, t_s, tma_bar_ptr=q_full, cache_policy=l2_policy("evict_first"))  # Q: read once


class EpiTma(V11Base):
    o_by_tma = True

    @cute.jit
    def _epilogue(self, mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit, wtid, tok0, head0,
                  kvh, s_q, bidx, io=None):
        """Key split, whole head blocks: each warpgroup normalises its 64 x 256 of O in registers, writes
        it as bf16 into its half of d of the Q buffer by stmatrix (16 x4 a thread instead of 128 scalar
        stores), fences the writes for the async proxy, meets its own 128 threads at one named barrier,
        and warp 0 stores the half by TMA (4 boxes of 64 x 64) and waits until the boxes have read smem
        (`_store_o`; V12 stores a 64-column tile at a time). No CTA-wide barrier:
        `_merge_row_sums`' SUMS barrier (bar.sync, both warpgroups) comes after each warpgroup's last wgmma
        wait, so every QK read of sQ is done before either writes O there; the halves are disjoint."""
        if cutlass.const_expr(not self._o_tma()):
            GatherAttentionSm90._epilogue(self, mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit,
                                          wtid, tok0, head0, kvh, s_q, bidx, io)
        else:
            c = self.cfg
            dt = mO.element_type
            pv_mma = self.tiled_mmas(dt)[1]
            thr_pv = pv_mma.get_slice(wtid)
            rO = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, c.dv_wg)), dt)
            rO_mn = mn_view(rO)
            for r in cutlass.range_constexpr(cute.size(O_mn, mode=[0])):
                r_cta = cO_mn[r, 0][0]  # tq = 1
                head = head0 + r_cta
                if cutlass.const_expr(c.hb < 64):  # rows past a TP split's hpg heads: never stored, no sink of their own
                    head = head0 + cutlass.min(r_cta, c.hb - 1)
                tot = quad_allreduce(row_sum[r], lambda a, b: a + b)
                m = row_max[r]
                m_base = m
                if m == -cutlass.Float32.inf:
                    m_base = cutlass.Float32(0.0)
                den = tot + cute.arch.exp2(mSink[head] * LOG2E - m_base)
                inv = cutlass.Float32(0.0)
                if den > 0.0:
                    inv = 1.0 / den
                for cc in cutlass.range_constexpr(cute.size(O_mn, mode=[1])):
                    rO_mn[r, cc] = (O_mn[r, cc] * inv).to(dt)
                if cutlass.const_expr(c.hb < 64):  # two branches: at 64 heads the cubins stay as measured
                    if (dsplit == 0) & (cO_mn[r, 0][1] == 0) & (r_cta < c.hb):
                        self._write_lse(mLse, tot, m_base, tok0, head, bidx)
                else:
                    if (dsplit == 0) & (cO_mn[r, 0][1] == 0):
                        self._write_lse(mLse, tot, m_base, tok0, head, bidx)
            store_O = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), dt), pv_mma,
            ).get_slice(wtid)
            self._store_o(io, store_O, rO, sQ, dsplit, wtid, tok0, head0, bidx)

    @cute.jit
    def _write_lse(self, mLse, tot, m_base, tok0, head, bidx):
        """One row's log-sum-exp (natural log; -inf for a row with no valid key)."""
        lse = -cutlass.Float32.inf
        if tot > 0.0:
            lse = (m_base + cute.math.log2(tot, fastmath=False)) * LN2
        mLse[tok0, head, bidx] = lse

    @cute.jit
    def _store_o(self, io, store_O, rO, sQ, dsplit, wtid, tok0, head0, bidx):
        """The warpgroup's normalised bf16 O (rO) into its half of d of the Q buffer and out by TMA (warp 0), a
        store tile (`_o_cols`) at a time: its stmatrix ops, fence, the warpgroup's barrier, its TMA box, while
        the next tile is written (one tile: v11); then warp 0 waits until the boxes have read smem (the CTA must not
        exit under them)."""
        c = self.cfg
        cols = self._o_cols()
        n_tiles = c.dv_wg // cols
        sO = cute.local_tile(sQ, (c.m_cta, c.dv_wg), (0, dsplit))
        src, dst = store_O.retile(rO), store_O.partition_D(sO)
        per_tile = cute.size(src, mode=[0, 1]) // n_tiles  # stmatrix op j writes the (j // per_tile)-th tile
        for t in cutlass.range_constexpr(n_tiles):
            for j in cutlass.range_constexpr(t * per_tile, (t + 1) * per_tile):
                cute.copy(store_O, src[(None, j), None, None], dst[(None, j), None, None])
            cute.arch.fence_proxy("async.shared", space="cta")  # st.shared (stmatrix) -> the TMA's reads
            cute.arch.barrier(barrier_id=EPI_WG0 + dsplit, number_of_threads=128)
            if wtid < 32:
                tma_o, mO_c = io[2], io[3]
                g = cute.local_tile(cute.domain_offset((head0, 0), mO_c[None, None, tok0, bidx]), (c.hb, c.dv_wg),
                                    (0, dsplit))
                t_s, t_g = cpasync.tma_partition(tma_o, 0, cute.make_layout(1),
                                                 cute.group_modes(cute.local_tile(sO, (c.hb, cols), (0, t)), 0, 2),
                                                 cute.group_modes(cute.local_tile(g, (c.hb, cols), (0, t)), 0, 2))
                cute.copy(tma_o, t_s, t_g)
        if wtid < 32:
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)


class GatherHint(V11Base):
    """The key split's row copies as `cp.async.cg.shared.global.L2::cache_hint` with an evict_last
    policy (the 8 MB of latent rows are read ~600 times a call; Q and O stream 0.5-1 GB past them
    through L2), src-size 0 for invalid slots, and FlashMLA-style addressing."""

    def _invalid_row(self):
        return Int32(-1) if self._v11_applies() else GatherAttentionSm90._invalid_row(self)

    @cute.jit
    def _copy_half_rows(self, atom, mK, dst, rows, t, h: int, kvh, bidx):
        """Half h of d of rows `rows` (-1: invalid, zero-filled) into rows t // 8 + 8 q of dst. Row
        t // 8 + 8 q has row % 8 = t // 8 (t < 64), so the swizzled chunk of this thread is the same in
        every row and segment: one shared address a thread (dst's base + (t // 8) * 128 +
        ((t % 8) ^ (t // 8)) * 16), rows and 128-byte segments as immediates (q * 1024, seg * 8192,
        `swizzled_k_offset`); one global address a row, segments as immediates (seg * 128)."""
        if cutlass.const_expr(not self._v11_applies()):
            GatherAttentionSm90._copy_half_rows(self, atom, mK, dst, rows, t, h, kvh, bidx)
        else:
            segs = self.cfg.d // 2 // 64
            policy = l2_policy("evict_last")
            base = cute.recast_ptr(dst.iterator, swizzle_=None).toint()
            g = t // 8
            mine = base + g * 128 + (((t % 8) ^ g) * 16)
            for q in cutlass.range_constexpr(cute.size(rows)):
                v = rows[q]
                size = Int32(16)
                if v < 0:
                    size = Int32(0)
                src = mK[cutlass.max(v, 0), kvh, None, bidx].iterator.toint() + (t % 8) * 16
                for sg in cutlass.range_constexpr(segs):
                    seg = h * segs + sg
                    cp_async_16_hint(mine, src, size, policy, q * 8 * 128 + seg * 64 * 128, seg * 128)


class V11(QFirst, EpiTma, GatherHint):
    """q-first + epi-tma + gather-hint."""

    q_by_tma = True
    o_by_tma = True


class SpinWait(V11):
    """v11 with the key split's stage waits polled by `mbarrier.try_wait` without a suspend hint (a
    TRYWAIT and a branch, as FlashMLA's SASS) instead of the library wait's NANOSLEEP.SYNCS between
    tries: ncu's PC sampling put 28% of v11's warp-stall samples on those sleeps (Pro s_q 4096)."""

    @cute.jit
    def _mbar_wait(self, bar, phase):
        done = cute.arch.mbarrier_try_wait(bar, phase)
        while not done:
            done = cute.arch.mbarrier_try_wait(bar, phase)


class V12(V11):
    """V11 storing O a 64-column tile at a time, FlashMLA's order: each tile's stmatrix, fence, barrier and TMA box
    while the next tile is written, then the wait for the boxes' reads before the CTA exits (FlashMLA's kernel exits
    without it; its form without the wait measured no faster: docs/perf/fmha.md). H200, three processes: 0.964-1.037x
    v11 per bar shape, 11 of 12 >= 1.00x; H100: the no-wait form 1.005-1.040x."""

    o_tile_cols = 64
