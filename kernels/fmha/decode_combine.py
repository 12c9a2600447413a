"""FP8 sparse decode, stage 3 (split-KV only): merge the key splits' partial outputs by their
log-sum-exp and apply the sink once.

Split s of request r gives O_s (normalised over its keys, no sink) and lse_s (natural log, -inf when
it had no valid key). With m = max_s lse_s and w_s = exp(lse_s - m):
    O   = sum_s w_s O_s / (sum_s w_s + exp(sink - m))
    lse = m + log(sum_s w_s)              (sink-free, as the oracle and FlashMLA report it)
A request with no valid key anywhere gets O = 0 and lse = -inf. One CTA per (head, request); each
of its 128 threads owns 4 of the 512 output values.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32
from cutlass.cute.runtime import make_fake_tensor

from kernels.fmha.config import LN2, LOG2E

THREADS, PER_THREAD = 128, 4


class DecodeCombine:
    def __init__(self, pdl: bool = False):
        """pdl: launched with programmatic dependent launch after an attention kernel that lets it start
        early (decode_pair.FusedHeadPairPdl): its CTAs take idle SMs and wait in griddepcontrol.wait for the
        partials, instead of the launch starting after the attention kernel's end."""
        self.pdl = pdl

    @cute.jit
    def __call__(self, mOp: cute.Tensor, mLp: cute.Tensor, mSink: cute.Tensor, mO: cute.Tensor,
                 mLse: cute.Tensor, stream):
        self.kernel(mOp, mLp, mSink, mO, mLse).launch(
            grid=[mO.shape[1], mO.shape[0], 1], block=[THREADS, 1, 1], stream=stream,
            **({"use_pdl": True} if self.pdl else {}))

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLp: cute.Tensor, mSink: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        h, r, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # the attention kernel's partials are complete and visible
        n_split = mLp.shape[1]
        m = -Float32.inf
        for s in cutlass.range(n_split, unroll=8):  # 8 splits' loads in flight (one at a time: h_q 128, one
            m = cute.arch.fmax(m, mLp[r, s, h])        # request, 9 splits was 2.5 us slower)
        acc = cute.make_rmem_tensor((PER_THREAD,), Float32)
        acc.fill(0.0)
        tot = Float32(0.0)
        base = tidx * PER_THREAD
        if m > -Float32.inf:
            for s in cutlass.range(n_split, unroll=4):
                w = cute.arch.exp2((mLp[r, s, h] - m) * LOG2E)
                tot = tot + w
                o = cute.make_rmem_tensor((PER_THREAD,), BFloat16)
                cute.autovec_copy(cute.local_tile(mOp[r, s, h, None], (PER_THREAD,), (tidx,)), o)
                for i in cutlass.range_constexpr(PER_THREAD):  # a split with no valid key (w = 0): O unread
                    acc[i] = acc[i] + cutlass.select_(w > Float32(0.0), w * o[i].to(Float32), Float32(0.0))
        inv = Float32(0.0)  # no valid key: O = 0
        if tot > Float32(0.0):
            inv = Float32(1.0) / (tot + cute.arch.exp2((mSink[h] - m) * LOG2E))
        for i in cutlass.range_constexpr(PER_THREAD):
            o = acc[i] * inv
            mO[r, h, base + i] = o.to(BFloat16)
        if tidx == 0:
            lse = -Float32.inf
            if tot > Float32(0.0):
                lse = m + cute.math.log2(tot, fastmath=False) * LN2
            mLse[r, h] = lse


def fake_args() -> tuple:
    """Partial O (b, splits, h, 512) and lse (b, splits, h), the sink (h,), O (b, h, 512) with any
    request/head strides, lse (b, h)."""
    b, s, h = (cute.sym_int32() for _ in range(3))

    def s64(div=1):
        return cute.sym_int64(divisibility=div)

    op = make_fake_tensor(BFloat16, (b, s, h, 512), (s64(8), s64(8), 512, 1), assumed_align=16)
    lp = make_fake_tensor(Float32, (b, s, h), (s64(), s64(), 1), assumed_align=4)
    sink = make_fake_tensor(Float32, (h,), (1,), assumed_align=4)
    o = make_fake_tensor(BFloat16, (b, h, 512), (s64(8), s64(8), 1), assumed_align=16)
    lse = make_fake_tensor(Float32, (b, h), (s64(), 1), assumed_align=4)
    return op, lp, sink, o, lse
