"""The FP8 decode's consumers split over d instead of over keys (candidate): both warpgroups take the same
64-key tile, warpgroup w the half w of d, for S and for O alike (V is K: the half it multiplies Q with is
the half of V it owns), so the two stages alternate tile by tile and the producer fills tile t + 1 while
the consumers take tile t.

Why (v8's knock-outs, docs/perf/fmha.md): at 8K the kernel sat ~17% above its producer alone: the key
split consumes both stages at once (each warpgroup its own tile, the partner's P across), so every refill
of a half is exposed once a pair. Here a warpgroup reads only its half of d of a stage and frees it after
its PV; the halves' fills overlap the other stage's tile.

Per tile t (stage t % 2), S = S0 + S1 over the halves of d:
    WG1: S1 (16 k-blocks) -> into smem (thread t's 32 accumulator values at sX[i * 128 + t]: both
         warpgroups' thread t hold the same (row, key) places) -> arrive S_FULL -> wait P_FULL -> its
         rows' rescale factor and max from smem -> O[:, 256:] *= it, += P V (P from smem) -> S1 of t + 1
    WG0: S0 -> wait S_FULL -> S = S0 + S1 -> mask, online softmax (the only one) -> P (stmatrix), the
         rows' factor and max into smem -> arrive P_FULL -> O[:, :256] *= factor, += P V (P from
         registers) -> S0 of t + 1
Each PV is queued with the next tile's QK behind it; a warpgroup frees its half of tile t's stage once both
are done (at the next tile's wait). The row sums are WG0's; it hands them over at the end. Barriers: two
named ones a tile (S_FULL: WG1 -> WG0, P_FULL: WG0 -> WG1); each buffer's next write comes after its
reader passed the barrier that follows its read. Shared memory: the exchange region grows to 16.5 KB
(the partial S, the factors and maxes); the key split's second P buffer goes unused.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.softmax import any_moved, quad_row_max, scale_rows

S_FULL, P_FULL = NamedBarrier.MAX0, NamedBarrier.MAX1  # the key split's ids, other roles here
CORR, ROWMAX = 4096, 4096 + 64  # sX: [0, 4096) WG1's partial S, then the rows' factors and maxes
XCHG_FLOATS = 4096 + 128


class DSplitConsumers:
    """Mixin over the fused decode (before it in the bases): `_pairs_wg0` / `_pairs_wg1` / `_merge_row_sums`."""

    def _xchg_floats(self) -> int:
        return XCHG_FLOATS

    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 0 over all 2 n_pairs tiles (the producer fills both stages a pair), two a loop trip; the last
        tile peeled: a wgmma under a run-time branch serialises every wgmma of the kernel (C7520)."""
        args = (qk_mma, pv_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn, cS_mn,
                row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2, causal_off, window)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, 0, True)
        warpgroup.commit_group()
        for pair in cutlass.range(n_pairs - 1, unroll=1):
            self._wg0_tile(*args, pair, 0, True)
            self._wg0_tile(*args, pair, 1, True)
        self._wg0_tile(*args, n_pairs - 1, 0, True)
        self._wg0_tile(*args, n_pairs - 1, 1, False)

    @cute.jit
    def _wg0_tile(self, qk_mma, pv_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tPsP, rP, S_mn, P_mn, O_mn,
                  cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2, causal_off, window,
                  pair, stage: cutlass.Constexpr, queue_next: cutlass.Constexpr):
        """Tile 2 pair + stage (stages constant: a run-time stage index made ptxas serialise the wgmmas)."""
        n_r = cute.size(S_mn, mode=[0])
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        warpgroup.wait_group(0)  # S0 of this tile
        cute.arch.barrier(barrier_id=S_FULL, number_of_threads=256)
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            acc_S[i] = acc_S[i] + sX[i * 128 + wtid]
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window)
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
                sX[CORR + cS_mn[r, 0][0]] = corr[r]
                sX[ROWMAX + cS_mn[r, 0][0]] = m_new
        cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, 0])
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> WG1's wgmma
        cute.arch.barrier_arrive(barrier_id=P_FULL, number_of_threads=256)
        if any_moved(corr):
            scale_rows(O_mn, corr)
        self._pv(pv_mma, acc_O, tOrP, tOrV, stage, True)
        self._queue_next(qk_mma, acc_S, tSrQ, tSrK, bars, pair, stage, 0, queue_next)

    @cute.jit
    def _pairs_wg1(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        args = (qk_mma, pv_ss_mma, acc_S, acc_O, tSrQ, tSrK, tOrV, tOsP, O_mn, cS_mn, row_max, sX, bars, wtid)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, 0, True)
        warpgroup.commit_group()
        for pair in cutlass.range(n_pairs - 1, unroll=1):
            self._wg1_tile(*args, pair, 0, True)
            self._wg1_tile(*args, pair, 1, True)
        self._wg1_tile(*args, n_pairs - 1, 0, True)
        self._wg1_tile(*args, n_pairs - 1, 1, False)

    @cute.jit
    def _wg1_tile(self, qk_mma, pv_ss_mma, acc_S, acc_O, tSrQ, tSrK, tOrV, tOsP, O_mn, cS_mn, row_max, sX, bars, wtid,
                  pair, stage: cutlass.Constexpr, queue_next: cutlass.Constexpr):
        n_r = cute.size(O_mn, mode=[0])
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        warpgroup.wait_group(0)  # S1 of this tile
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            sX[i * 128 + wtid] = acc_S[i]
        cute.arch.barrier_arrive(barrier_id=S_FULL, number_of_threads=256)
        cute.arch.barrier(barrier_id=P_FULL, number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):
            corr[r] = sX[CORR + cS_mn[r, 0][0]]
            row_max[r] = sX[ROWMAX + cS_mn[r, 0][0]]
        if any_moved(corr):
            scale_rows(O_mn, corr)
        self._pv(pv_ss_mma, acc_O, tOsP[None, None, None, 0], tOrV, stage, False)
        self._queue_next(qk_mma, acc_S, tSrQ, tSrK, bars, pair, stage, 1, queue_next)

    @cute.jit
    def _queue_next(self, qk_mma, acc_S, tSrQ, tSrK, bars, pair, stage: cutlass.Constexpr, half: cutlass.Constexpr,
                    queue_next: cutlass.Constexpr):
        """Queue the next tile's S over this warpgroup's half of d behind the PV, wait for the PV and free this
        stage's half (its last reader). The PV's wait before the tile ends: leaving it to the next tile's
        wait made ptxas serialise every wgmma (C7515, an accumulator defined inside an open stage)."""
        if cutlass.const_expr(queue_next):
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1 - stage, half, (pair + stage) & 1, True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)
        else:
            warpgroup.wait_group(0)
        self._release(bars + 4 + 2 * stage + half)

    @cute.jit
    def _merge_row_sums(self, row_sum, sX, wg, wtid):
        """WG0 holds the row sums (the only softmax): its thread wtid hands its partial sums to WG1's (the same
        rows); the barrier also orders both warpgroups' last wgmma waits before the epilogue's O stores into
        the Q buffer."""
        n_r = cute.size(row_sum)
        if wg == 0:
            for r in cutlass.range_constexpr(n_r):
                sX[wtid * n_r + r] = row_sum[r]
        cute.arch.barrier(barrier_id=NamedBarrier.SUMS, number_of_threads=256)
        if wg == 1:
            for r in cutlass.range_constexpr(n_r):
                row_sum[r] = sX[wtid * n_r + r]
