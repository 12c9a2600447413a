"""The epilogue: O /= (row sum + exp(sink - row max)), stored as bf16, and the natural-log LSE."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.config import LN2, LOG2E
from kernels.fmha.softmax import quad_allreduce


class Epilogue:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _epilogue(self, mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit, wtid, tok0, head0,
                  kvh, s_q, bidx, io=None):
        """Normalise (sink in the denominator) and store O: staged in smem (the Q buffer) and written
        as 16-byte rows, or, persistent, straight from registers as column pairs (the Q buffer is
        already taking the next item's Q; O is a small part of the traffic of d <= 256). `io`: a variant's
        TMA atoms (None here; prefill_v11.EpiTma stores O by TMA)."""
        c = self.cfg
        n_consumers = 128 * c.n_consumer_wg
        if cutlass.const_expr(not c.persistent):
            cute.arch.barrier(barrier_id=NamedBarrier.EPILOGUE, number_of_threads=n_consumers)  # all QK reads of sQ done
        pair = cute.make_rmem_tensor((2,), mO.element_type)
        for r in cutlass.range_constexpr(cute.size(O_mn, mode=[0])):
            r_cta = mrow * 64 + cO_mn[r, 0][0]
            t = tok0 + r_cta // c.hb
            head = head0 + r_cta % c.hb
            ok = (t < s_q) & (head - kvh * c.hpg < c.hpg) & (r_cta < c.hb * c.tq)
            tot = quad_allreduce(row_sum[r], lambda a, b: a + b)
            m = row_max[r]
            m_base = m
            if m == -cutlass.Float32.inf:
                m_base = cutlass.Float32(0.0)
            # the sink: a virtual key in the denominator only (-inf = no sink)
            den = tot + cute.arch.exp2(mSink[head if ok else 0] * LOG2E - m_base)
            inv = cutlass.Float32(0.0)
            if den > 0.0:
                inv = 1.0 / den
            if cutlass.const_expr(c.persistent):
                if ok:  # columns cc, cc + 1 of the accumulator are adjacent columns of O
                    for cc in cutlass.range_constexpr(0, cute.size(O_mn, mode=[1]), 2):
                        pair[0] = (O_mn[r, cc] * inv).to(mO.element_type)
                        pair[1] = (O_mn[r, cc + 1] * inv).to(mO.element_type)
                        cute.autovec_copy(pair, cute.local_tile(mO[t, head, None, bidx], (2,), (cO_mn[r, cc][1] // 2,)))
            else:
                for cc in cutlass.range(cute.size(O_mn, mode=[1]), unroll_full=True):
                    sQ[r_cta, dsplit * c.dv_wg + cO_mn[r, cc][1]] = (O_mn[r, cc] * inv).to(mO.element_type)
            if ok & (dsplit == 0) & (cO_mn[r, 0][1] == 0):
                lse = -cutlass.Float32.inf
                if tot > 0.0:
                    lse = (m_base + cute.math.log2(tot, fastmath=False)) * LN2
                mLse[t, head, bidx] = lse
        if cutlass.const_expr(not c.persistent):
            cute.arch.barrier(barrier_id=NamedBarrier.EPILOGUE, number_of_threads=n_consumers)
            tid = mrow * 128 * c.n_dsplit + dsplit * 128 + wtid
            cpr = c.dv // 8
            rpp = n_consumers // cpr
            chunk = tid % cpr
            frag = cute.make_rmem_tensor((8,), mO.element_type)
            for p in cutlass.range(c.m_cta // rpp, unroll_full=True):
                r = p * rpp + tid // cpr
                t = tok0 + r // c.hb
                head = head0 + r % c.hb
                if (t < s_q) & (head - kvh * c.hpg < c.hpg) & (r < c.hb * c.tq):
                    cute.autovec_copy(cute.local_tile(sQ[r, None], (8,), (chunk,)), frag)
                    cute.autovec_copy(frag, cute.local_tile(mO[t, head, None, bidx], (8,), (chunk,)))
