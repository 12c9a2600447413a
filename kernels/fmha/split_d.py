"""dv = 512 with V != K: the two consumer warpgroups split S = Q K^T along d and add their fp32
partials through smem; each owns a 256-wide half of O."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier


class SplitD:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config. Knock-out seam: `_split_d` (the whole schedule)."""

    @cute.jit
    def _split_d(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                 row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, sX, dsplit, wtid):
        """dv = 512 with V != K: each warpgroup computes S over its half of d, the two add their
        partials through smem (bitwise the same S in both), then each multiplies P into its half of O."""
        softmax_args = (S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window)
        corr = cute.make_rmem_tensor((cute.size(S_mn, mode=[0]),), cutlass.Float32)
        S = self.cfg.stages
        for kt in cutlass.range(n_tiles, unroll=1):
            self._wait_k(bars, kt)
            acc_S.fill(0.0)
            self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, kt % S, dsplit, n_kb)
            warpgroup.wait_group(0)
            self._exchange_partial_s(acc_S, sX, dsplit, wtid)
            self._softmax_scores(*softmax_args, corr, kt % S)
            self._release_k(bars, kt)
            self._rescale_o_cast_p(O_mn, corr, acc_S, rP)
            self._wait_v(bars, kt)
            self._pv(pv_mma, acc_O, tOrP, tOrV, kt % S, True)
            warpgroup.wait_group(0)
            self._release_v(bars, kt)

    @cute.jit
    def _exchange_partial_s(self, acc_S, sX, dsplit, wtid):
        """S = S_0 + S_1 in both warpgroups of a d split, through one smem buffer (sX[thread + 128 i],
        thread-major so the 128 lanes hit distinct banks). WG1 publishes S_1; WG0 adds it, then
        publishes S_0; WG1 adds that. Both sum in the order S_0 + S_1: bitwise the same S."""
        nv = cute.size(acc_S)
        if dsplit == 1:
            for i in cutlass.range_constexpr(nv):
                sX[wtid + 128 * i] = acc_S[i]
            cute.arch.barrier_arrive(barrier_id=NamedBarrier.XCHG_S1, number_of_threads=256)
            cute.arch.barrier(barrier_id=NamedBarrier.XCHG_S0, number_of_threads=256)
            for i in cutlass.range_constexpr(nv):
                acc_S[i] = sX[wtid + 128 * i] + acc_S[i]
        else:
            cute.arch.barrier(barrier_id=NamedBarrier.XCHG_S1, number_of_threads=256)
            for i in cutlass.range_constexpr(nv):
                other = sX[wtid + 128 * i]
                sX[wtid + 128 * i] = acc_S[i]
                acc_S[i] = acc_S[i] + other
            cute.arch.barrier_arrive(barrier_id=NamedBarrier.XCHG_S0, number_of_threads=256)
