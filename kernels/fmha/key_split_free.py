"""The key split without the max hand-off (candidate): each consumer warpgroup runs its own online
softmax and publishes its P with the row max it was taken against; the partner folds that P into its
half of O in registers, rescaled onto its own running max.

key_split.py's pair is a chain: WG0's max -> WG1's softmax and final max -> WG0's P rescaled -> the P
exchange (four named barriers a pair, ~22% of the decode consumers' time, docs/perf/fmha.md). Here both
softmaxes run at once and each warpgroup waits only for the partner's P:

    own tile: m' = max(m, tile max); P = exp2(S scale - m'); O *= exp2(m - m') if it moved;
              P (stmatrix) and m' into smem; arrive P_FULL; O += P V_own-half (RS)
    partner:  wait its P_FULL; read its m_p; m'' = max(m', m_p); O, row sum *= exp2(m' - m'') if moved;
              its P (ldmatrix) into the P registers; arrive its P_FREE; P *= exp2(m_p - m'') (<= 1) if
              any row needs it; O += P V_partner's tile-half (RS)

A warpgroup's row sum counts its own tiles only, relative to its running max. Both warpgroups end on
the same max (each saw every tile's max: its own, and the partner's through the published m), so
key_split's end-of-item swap of the row sums (`_merge_row_sums`) is unchanged. The partner's P is
rounded to bf16 twice where a factor < 1 applies (its own max moved past the partner's): one more
rounding of a value the MMA takes in bf16 anyway.

Barriers (named, 256 threads): P_FULL of WG w (its P and maxes are in smem) and P_FREE of WG w (the
partner has read them: w may overwrite them, from its second pair on). P of WG w lives in sP[w], its
maxes in sX[64 w:64 w + 64] (WG1's slot is the row sums' first 64 floats, written only at the end,
after both its last reads).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.softmax import any_moved, quad_row_max, scale_rows

P_FULL = (NamedBarrier.MAX0, NamedBarrier.MAX1)  # by warpgroup: reused ids of the max hand-off
P_FREE = (NamedBarrier.P0, NamedBarrier.P1)


class FreeMaxKeySplit:
    """Mixin over `KeySplit` (before the kernel class in the bases): `_pairs_wg0` / `_pairs_wg1` replaced."""

    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 0: tiles 2p in stage 0, O[:, :256]; frees 0-left and 1-left. The last pair peeled (C7520)."""
        args = (qk_mma, pv_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn, cS_mn,
                row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2, causal_off, window)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, 0, True)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, 0, False)
        warpgroup.commit_group()
        for pair in cutlass.range(n_pairs - 1, unroll=1):
            self._free_wg0_pair(*args, pair, False)
        self._free_wg0_pair(*args, n_pairs - 1, True)

    @cute.jit
    def _free_wg0_pair(self, qk_mma, pv_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tPsP, rP, S_mn, P_mn,
                       O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                       causal_off, window, pair, last: cutlass.Constexpr):
        empty = bars + 4
        warpgroup.wait_group(0)  # S of this pair's tile 2p
        self._own_tile(pv_mma, store_P, acc_O, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn, cS_mn, row_max, row_sum,
                       row_tok, sIdx, sMaskFlag, sX, wtid, scale_log2, causal_off, window, pair, 0)
        warpgroup.wait_group(0)
        self._release(empty + 0)  # 0-left: its last reader was this PV
        self._partner_tile(qk_mma, pv_mma, acc_O, tOrP, tOrV, tPsP, rP, P_mn, O_mn, cS_mn, row_max, row_sum, sX,
                           wtid, 0, not last)
        if cutlass.const_expr(last):
            warpgroup.wait_group(0)
            self._release(empty + 2)  # 1-left
        else:  # queue the next tile's S behind it
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, (pair + 1) & 1, True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            self._release(empty + 2)
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, (pair + 1) & 1, False)
            warpgroup.commit_group()

    @cute.jit
    def _pairs_wg1(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 1: tiles 2p + 1 in stage 1, O[:, 256:]; frees 1-right and 0-right."""
        empty = bars + 4
        for pair in cutlass.range(n_pairs, unroll=1):
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 1, pair & 1, True)
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 0, pair & 1, False)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self._own_tile(pv_mma, store_P, acc_O, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn, cS_mn, row_max, row_sum,
                           row_tok, sIdx, sMaskFlag, sX, wtid, scale_log2, causal_off, window, pair, 1)
            warpgroup.wait_group(0)
            self._release(empty + 3)  # 1-right
            self._partner_tile(qk_mma, pv_mma, acc_O, tOrP, tOrV, tPsP, rP, P_mn, O_mn, cS_mn, row_max, row_sum,
                               sX, wtid, 1, pair + 1 < n_pairs)
            warpgroup.wait_group(0)
            self._release(empty + 1)  # 0-right

    @cute.jit
    def _own_tile(self, pv_mma, store_P, acc_O, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn, cS_mn, row_max, row_sum,
                  row_tok, sIdx, sMaskFlag, sX, wtid, scale_log2, causal_off, window, pair, wg: cutlass.Constexpr):
        """Warpgroup wg's own tile (stage wg): mask, softmax on its own running max, publish P and the max,
        queue O += P V over its half of d (no wait)."""
        n_r = cute.size(S_mn, mode=[0])
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, wg, row_tok, causal_off, window)
        if pair > 0:  # the partner has read this warpgroup's previous P and maxes
            cute.arch.barrier(barrier_id=P_FREE[wg], number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):  # the scale is positive: it commutes with the max
            m_new = cute.arch.fmax(row_max[r], quad_row_max(S_mn, r) * scale_log2)
            corr[r] = cute.arch.exp2(row_max[r] - m_new)
            row_max[r] = m_new
            acc = cutlass.Float32(0.0)
            for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                pv = self._exp2(S_mn[r, cc] * scale_log2 - m_new, cc)
                acc += pv
                P_mn[r, cc] = pv.to(P_mn.element_type)
            row_sum[r] = row_sum[r] * corr[r] + acc
            if wtid % 4 == 0:
                sX[64 * wg + cS_mn[r, 0][0]] = m_new
        cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, wg])
        cute.arch.barrier_arrive(barrier_id=P_FULL[wg], number_of_threads=256)  # ldmatrix reads it: no proxy fence
        if any_moved(corr):
            scale_rows(O_mn, corr)
        self._pv(pv_mma, acc_O, tOrP, tOrV, wg, True)

    @cute.jit
    def _partner_tile(self, qk_mma, pv_mma, acc_O, tOrP, tOrV, tPsP, rP, P_mn, O_mn, cS_mn, row_max, row_sum, sX,
                      wtid, wg: cutlass.Constexpr, free):
        """The partner's tile (stage 1 - wg): its P and maxes from smem (then free them for it, unless
        `free` is false: its last pair), both on this warpgroup's running max, queue O += P V (no wait).
        The caller has waited for this warpgroup's own PV (P's registers are free)."""
        n_r = cute.size(P_mn, mode=[0])
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        fac = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        cute.arch.barrier(barrier_id=P_FULL[1 - wg], number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):
            m_p = sX[64 * (1 - wg) + cS_mn[r, 0][0]]
            m_new = cute.arch.fmax(row_max[r], m_p)
            corr[r] = cute.arch.exp2(row_max[r] - m_new)
            fac[r] = cute.arch.exp2(m_p - m_new)
            row_max[r] = m_new
            row_sum[r] = row_sum[r] * corr[r]
        load_P = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), rP.element_type),
            qk_mma,
        ).get_slice(wtid)  # the C partition of S, as the P store's: the same smem addresses
        cute.copy(load_P, tPsP[None, None, None, 1 - wg], load_P.retile(rP))
        if free:
            cute.arch.barrier_arrive(barrier_id=P_FREE[1 - wg], number_of_threads=256)
        if any_moved(corr):
            scale_rows(O_mn, corr)
        if any_moved(fac):
            for r in cutlass.range_constexpr(n_r):
                for cc in cutlass.range_constexpr(cute.size(P_mn, mode=[1])):
                    P_mn[r, cc] = (P_mn[r, cc].to(cutlass.Float32) * fac[r]).to(P_mn.element_type)
        self._pv(pv_mma, acc_O, tOrP, tOrV, 1 - wg, True)
