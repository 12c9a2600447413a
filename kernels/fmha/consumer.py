"""The consumer warpgroups: their fragments and per-row state, then per work item one of the three
schedules (ping-pong, d split, key split) and the epilogue."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.config import MAX_INIT
from kernels.fmha.mma import acc_as_operand_a
from kernels.regs import mn_view
from kernels.trace import record


class Consumer:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _consume(
        self, mQ, mK, mIdx, mLen, mO, mLse, mSink, scale_log2, causal_off, window, qk_mma, pv_mma, pv_ss_mma,
        sQ, sK, sVt, sIdx, sMaskFlag, sX, sP, bars, wg, wtid, io=None,
    ):
        c = self.cfg
        n = c.n_block
        S = c.stages
        q_full, q_empty = bars + 4 * S, bars + 4 * S + 1
        s_q = cute.size(mQ, mode=[0])
        mrow = wg // c.n_dsplit
        dsplit = wg % c.n_dsplit
        sQ_wg = cute.local_tile(sQ, (64, c.d), (mrow, 0))
        sVt_wg = cute.local_tile(sVt, (c.dv_wg, n, S), (dsplit, 0, 0))
        thr_qk = qk_mma.get_slice(wtid)
        thr_pv = pv_mma.get_slice(wtid)
        tSrQ = qk_mma.make_fragment_A(thr_qk.partition_A(sQ_wg))
        tSrK = qk_mma.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(thr_pv.partition_B(sVt_wg))
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, n)), cutlass.Float32)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, c.dv_wg)), cutlass.Float32)
        rP = cute.make_rmem_tensor(acc_S.layout, mO.element_type)
        tOrP = acc_as_operand_a(rP)
        S_mn = mn_view(acc_S)
        P_mn = mn_view(rP)
        O_mn = mn_view(acc_O)
        cS_mn = mn_view(thr_qk.partition_C(cute.make_identity_tensor((64, n))))
        cO_mn = mn_view(thr_pv.partition_C(cute.make_identity_tensor((64, c.dv_wg))))
        n_r = cute.size(S_mn, mode=[0])
        n_kb = cute.size(tSrQ, mode=[2]) // c.n_dsplit  # QK k-blocks of this warpgroup's d slice (d split)
        record("Q operand fragments (tSrQ)", tSrQ)
        record("K operand fragments (tSrK)", tSrK)
        record("V^T operand fragments (tOrV)", tOrV)
        record("S accumulator (acc_S)", acc_S)
        record("S as (rows, cols) of this thread (acc_S_mn)", S_mn)
        record("O accumulator (acc_O)", acc_O)
        record("P as PV operand A (tOrP)", tOrP)

        # per-row state: running max (log2 domain), this thread's partial row sum, query token
        row_max = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_tok = cute.make_rmem_tensor((n_r,), cutlass.Int32)

        # both GEMMs accumulate (acc_S is zeroed per tile): the MMA state is set once, outside
        # the staged loops, so no loop region owns it
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        if cutlass.const_expr(c.key_split):
            pv_ss_mma.set(warpgroup.Field.ACCUMULATE, True)
            tOsP = pv_ss_mma.make_fragment_A(pv_ss_mma.get_slice(wtid).partition_A(sP))
            store_P = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), rP.element_type),
                qk_mma,
            ).get_slice(wtid)
            tPsP = store_P.partition_D(sP)
            record("partner's P operand fragments (tOsP)", tOsP)
            record("P registers -> smem (stmatrix) destination (tPsP)", tPsP)
        if cutlass.const_expr(c.n_dsplit == 1):  # the ping-pong, persistent or not (v7b hung without this)
            if wg == 1:
                cute.arch.barrier_arrive(barrier_id=NamedBarrier.TURN0, number_of_threads=256)  # warpgroup 0 goes first
        base = cutlass.Int32(0)  # key tiles of the earlier items (the producer counts alike)
        for w in cutlass.range(self._items_of_cta(mIdx, mK, mQ), unroll=1):
            _, bidx, kvh, head0, _, n_tiles, tok0 = self._item(w, mIdx, mK, mQ, mLen)
            acc_O.fill(0.0)
            row_max.fill(MAX_INIT if c.key_split else -cutlass.Float32.inf)
            row_sum.fill(0.0)
            for r in cutlass.range_constexpr(n_r):
                row_tok[r] = tok0 + (mrow * 64 + cS_mn[r, 0][0]) // c.hb
            cute.arch.mbarrier_wait(q_full, w & 1)
            if cutlass.const_expr(c.tma_kv):  # Q came by cp.async; the K/V waits fence only gathered tiles
                cute.arch.fence_proxy("async.shared", space="cta")
            if cutlass.const_expr(c.key_split):
                args = (qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP, S_mn,
                        P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                        causal_off, window, (n_tiles + 1) // 2)
                if wg == 0:
                    self._pairs_wg0(*args)
                else:
                    self._pairs_wg1(*args)
                self._merge_row_sums(row_sum, sX, wg, wtid)
            else:
                args = (qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max,
                        row_sum, row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb)
                if cutlass.const_expr(c.n_dsplit == 1):
                    self._pingpong(*args, wg, base, q_empty)
                else:
                    self._split_d(*args, sX, dsplit, wtid)
            self._epilogue(mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit, wtid, tok0, head0,
                           kvh, s_q, bidx, io)
            base = base + n_tiles
        if cutlass.const_expr(c.n_dsplit == 1):
            if wg == 0:
                cute.arch.barrier(barrier_id=NamedBarrier.TURN0, number_of_threads=256)  # pairs warpgroup 1's last arrive
