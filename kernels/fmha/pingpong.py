"""d <= 256: two consumer warpgroups of 64 rows each take turns on the tensor cores (FA3's
schedule, written for this kernel; docs/lessons/fmha.md 17 and 25)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.softmax import any_moved, scale_rows


class PingPong:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config. Knock-out seam: `_pingpong` (the whole schedule)."""

    @cute.jit
    def _pingpong(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                  row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, wg, base, q_empty):
        """d <= 256, two warpgroups of 64 rows each (FA3's schedule, written for this kernel): a
        warpgroup issues S(kt) = Q K^T and O += P(kt-1) V(kt-1) back to back while it holds the
        turn, hands the turn over and runs the softmax of S(kt) while the partner's GEMMs use the
        tensor cores. The turn (named barriers NamedBarrier.TURN0 + w) keeps the two out of phase; left
        free they fall into step, because both wait for the same smem stages. The turns run on across
        the CTA's work items (warpgroup 1 opens the first, warpgroup 0 closes the last, `_consume`):
        warpgroup 0 starts the next item's S while warpgroup 1 finishes the current one. Tile kt of
        the item is the CTA's tile base + kt; q_empty is signalled once the item's last S is done."""
        softmax_args = (S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window)
        corr = cute.make_rmem_tensor((cute.size(S_mn, mode=[0]),), cutlass.Float32)
        mine, other = NamedBarrier.TURN0 + wg, NamedBarrier.TURN0 + 1 - wg
        S = self.cfg.stages
        self._wait_k(bars, base)
        acc_S.fill(0.0)
        cute.arch.barrier(barrier_id=mine, number_of_threads=256)
        self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, base % S, 0, n_kb)
        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
        warpgroup.wait_group(0)
        self._softmax_scores(*softmax_args, corr, base % S)
        self._release_k(bars, base)
        self._rescale_o_cast_p(O_mn, corr, acc_S, rP)
        for kt in cutlass.range(base + 1, base + n_tiles, unroll=1):
            self._wait_k(bars, kt)  # the waits and the zeroing stay outside the turn: it is only
            self._wait_v(bars, kt - 1)  # held while the GEMMs are issued
            acc_S.fill(0.0)
            cute.arch.barrier(barrier_id=mine, number_of_threads=256)
            self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, kt % S, 0, n_kb)
            self._pv(pv_mma, acc_O, tOrP, tOrV, (kt - 1) % S, True)
            cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
            warpgroup.wait_group(1)  # S(kt); PV(kt-1) still runs
            self._softmax_scores(*softmax_args, corr, kt % S)
            self._release_k(bars, kt)
            self._wait_pv_rescale_o(O_mn, corr)  # PV(kt-1): P and O are free
            self._release_v(bars, kt - 1)
            rP.store(acc_S.load().to(rP.element_type))
        cute.arch.mbarrier_arrive(q_empty)  # every S of the item is done: sQ may take the next Q
        last = base + n_tiles - 1
        self._wait_v(bars, last)
        cute.arch.barrier(barrier_id=mine, number_of_threads=256)
        self._pv(pv_mma, acc_O, tOrP, tOrV, last % S, True)
        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
        warpgroup.wait_group(0)
        self._release_v(bars, last)

    @cute.jit
    def _wait_pv_rescale_o(self, O_mn, corr):
        """Wait for the queued PV (it reads P, accumulates O), then O *= corr where a row max moved.
        The wait sits in both arms of the vote's branch on purpose: in one straight-line block with
        the softmax, ptxas scheduled the wgmma wait above the exponentials (they touch neither P
        nor O), so the softmax ran after PV(kt-1) instead of under it (docs/lessons/fmha.md, 25)."""
        if any_moved(corr):
            warpgroup.wait_group(0)
            scale_rows(O_mn, corr)
        else:
            warpgroup.wait_group(0)
