"""dv = 512 with V = K (the DSV4 latent): the two consumer warpgroups take alternate 64-key tiles
over the full d, agree on the row max and trade their bf16 P through smem; each owns half of O
(FlashMLA's decomposition, written anew; docs/perf/fmha.md, v4a).

Per pair p, warpgroup w owns tile 2p + w: WG0 publishes max(old, own) through smem, WG1 folds in
its own and publishes the final max; each multiplies its own P from registers and the partner's P
from smem into its half of O. Named-barrier roles per pair: MAX0 WG0 -> WG1, MAX1 WG1 -> WG0,
P0 WG0 -> WG1, P1 WG1 -> WG0; a warpgroup reaches a barrier of pair p + 1 only after the partner
passed it in pair p."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.softmax import any_moved, quad_row_max, scale_rows


class KeySplit:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config. Knock-out seams: `_pairs_wg0` / `_pairs_wg1` (each warpgroup's schedule) and
    `_softmax_tile` (the softmax of one row)."""

    @cute.jit
    def _qk_half(self, qk_mma, acc_S, tSrQ, tSrK, bars, stage: int, h: int, phase, zero: bool):
        """Wait for half h of d of the tile in `stage`, queue its k-blocks of S = Q K^T (no commit)."""
        n_kb = cute.size(tSrQ, mode=[2]) // 2
        self._mbar_wait(bars + stage * 2 + h, phase)
        cute.arch.fence_proxy("async.shared", space="cta")  # cp.async writes -> wgmma reads
        if cutlass.const_expr(zero):
            acc_S.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(n_kb):
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, h * n_kb + kb], tSrK[None, None, h * n_kb + kb, stage], acc_S)

    def _release(self, bar):
        """A consumer thread frees a K half: its last wgmma read of it is done (a seam: decode_pair.py
        also frees the peer CTA's)."""
        cute.arch.mbarrier_arrive(bar)

    @cute.jit
    def _softmax_tile(self, S_mn, P_mn, corr, cS_mn, row_max, row_sum, sM, wtid, r: int, m_new, scale_log2):
        """Row r with the new running max: P = exp2(S * scale - m_new) (fp32 kept in S, bf16 in P), rescale
        the row's partial sum, corr[r] = O's factor (the caller applies it), publish m_new (one lane
        of the quad)."""
        corr[r] = cute.arch.exp2(row_max[r] - m_new)
        row_max[r] = m_new
        acc = cutlass.Float32(0.0)
        for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
            pv = self._exp2(S_mn[r, cc] * scale_log2 - m_new, cc)
            S_mn[r, cc] = pv
            acc += pv
            P_mn[r, cc] = pv.to(P_mn.element_type)
        row_sum[r] = row_sum[r] * corr[r] + acc
        if wtid % 4 == 0:
            sM[cS_mn[r, 0][0]] = m_new

    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 0: tiles 2p in stage 0, O[:, :256]; frees 0-left and 1-left. The last pair is
        peeled off: a wgmma under a runtime branch (queue the next S or not) makes ptxas serialize
        every wgmma of the kernel (C7520, docs/lessons/fmha.md)."""
        args = (qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP, S_mn, P_mn,
                O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2, causal_off, window)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, 0, True)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, 0, False)
        warpgroup.commit_group()
        for pair in cutlass.range(n_pairs - 1, unroll=1):
            self._wg0_pair(*args, pair, False)
        self._wg0_pair(*args, n_pairs - 1, True)

    @cute.jit
    def _wg0_pair(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                  S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                  causal_off, window, pair, last: cutlass.Constexpr):
        empty = bars + 4
        n_r = cute.size(S_mn, mode=[0])
        warpgroup.wait_group(0)  # S of this pair's tile 2p
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, 0, row_tok, causal_off, window)
        for r in cutlass.range_constexpr(n_r):  # the scale is positive: it commutes with the max
            mx = quad_row_max(S_mn, r) * scale_log2
            self._softmax_tile(S_mn, P_mn, corr, cS_mn, row_max, row_sum, sX, wtid, r, cute.arch.fmax(row_max[r], mx),
                               scale_log2)
        cute.arch.barrier_arrive(barrier_id=NamedBarrier.MAX0, number_of_threads=256)  # the max is out; O is private
        if any_moved(corr):
            scale_rows(O_mn, corr)
        self._pv(pv_mma, acc_O, tOrP, tOrV, 0, True)
        warpgroup.wait_group(0)
        self._release(empty + 0)  # 0-left: its last reader was this PV
        cute.arch.barrier(barrier_id=NamedBarrier.MAX1, number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):  # move P, O and the sum onto WG1's final max
            final = sX[cS_mn[r, 0][0]]
            corr[r] = cute.arch.exp2(row_max[r] - final)
            row_max[r] = final
            row_sum[r] = row_sum[r] * corr[r]
            for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                P_mn[r, cc] = (S_mn[r, cc] * corr[r]).to(P_mn.element_type)
        scale_rows(O_mn, corr)  # unguarded: with the vote here ptxas spilled 4 B
        cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, 0])
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the partner's wgmma
        cute.arch.barrier_arrive(barrier_id=NamedBarrier.P0, number_of_threads=256)
        cute.arch.barrier(barrier_id=NamedBarrier.P1, number_of_threads=256)
        self._pv(pv_ss_mma, acc_O, tOsP[None, None, None, 1], tOrV, 1, False)
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
        n_r = cute.size(S_mn, mode=[0])
        tile_max = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        for pair in cutlass.range(n_pairs, unroll=1):
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 1, pair & 1, True)
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 0, pair & 1, False)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, 1, row_tok, causal_off, window)
            for r in cutlass.range_constexpr(n_r):
                tile_max[r] = quad_row_max(S_mn, r) * scale_log2
            cute.arch.barrier(barrier_id=NamedBarrier.MAX0, number_of_threads=256)
            for r in cutlass.range_constexpr(n_r):  # WG0's max already includes the old running max
                self._softmax_tile(S_mn, P_mn, corr, cS_mn, row_max, row_sum, sX, wtid, r,
                                   cute.arch.fmax(sX[cS_mn[r, 0][0]], tile_max[r]), scale_log2)
            cute.arch.barrier_arrive(barrier_id=NamedBarrier.MAX1, number_of_threads=256)
            if any_moved(corr):
                scale_rows(O_mn, corr)
            self._pv(pv_mma, acc_O, tOrP, tOrV, 1, True)
            cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, 1])
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=NamedBarrier.P0, number_of_threads=256)
            self._pv(pv_ss_mma, acc_O, tOsP[None, None, None, 0], tOrV, 0, False)
            cute.arch.barrier_arrive(barrier_id=NamedBarrier.P1, number_of_threads=256)
            warpgroup.wait_group(1)
            self._release(empty + 3)  # 1-right
            warpgroup.wait_group(0)
            self._release(empty + 1)  # 0-right

    @cute.jit
    def _merge_row_sums(self, row_sum, sX, wg, wtid):
        """Key split: each warpgroup summed P over its own tiles. The partner's thread wtid holds
        the same rows, so one swap through smem gives both the full per-thread sum (a + b == b + a:
        both warpgroups end bitwise equal)."""
        n_r = cute.size(row_sum)
        for r in cutlass.range_constexpr(n_r):
            sX[64 + (wg * 128 + wtid) * n_r + r] = row_sum[r]
        cute.arch.barrier(barrier_id=NamedBarrier.SUMS, number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):
            row_sum[r] = row_sum[r] + sX[64 + ((1 - wg) * 128 + wtid) * n_r + r]
