"""mHC pass 2 in CuTeDSL (spec §3.3, §3.5): reduce the mix partials, turn them into the stream
weights, and collapse the 4 streams.

    mixes = (Σ_s part[s, :24, t]) · rsqrt(Σ_s part[s, 24, t] / 4D + eps)
    hc_pre:  pre = sigmoid(mixes[:4]·scale0 + base) + eps;  post = 2·sigmoid(mixes[4:8]·scale1 + base)
             comb = Sinkhorn(mixes[8:]·scale2 + base)  (row softmax + eps, column normalise, then 19 x
             row/column normalise, each dividing by sum + eps: the kernel's op order)
    hc_head: pre = sigmoid(mixes·scale + base) + eps
    y[t] = Σ_i pre_i · X[t, i]  (fp32, one cast)

A CTA owns 32 tokens: its 4 warps reduce the partials (coalesced over tokens) into shared memory,
warp 0 runs the per-token scalar math (one lane per token), then all 128 threads stream the 4
streams of each token in 16-byte vectors and write y. One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
from cutlass import Float32

HC = 4
TOKENS = 32
THREADS = 128


def _sigmoid(z):
    return 1.0 / (1.0 + cute.math.exp(-z))


class HcApplyKernel:
    """Compile-time: head (hc_head) or pre (hc_pre), D, Sinkhorn iterations, eps values."""

    def __init__(self, head: bool, d: int, iters: int = 20, hc_eps: float = 1e-6, norm_eps: float = 1e-6):
        if d % 8:
            raise ValueError(f"mHC needs D % 8 == 0, got {d}")
        self.head, self.d, self.iters, self.hc_eps, self.norm_eps = head, d, iters, hc_eps, norm_eps
        self.n_mix = HC if head else (2 + HC) * HC
        self.vec = 8
        self.vecs_per_thread = -(-(d // self.vec) // THREADS)

    @cute.jit
    def __call__(self, mPart: cute.Tensor, mX: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
                 mY: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, stream):
        self.kernel(mPart, mX, mScale, mBase, mY, mPost, mComb).launch(
            grid=[cute.ceil_div(mX.shape[0], TOKENS), 1, 1], block=[THREADS, 1, 1], stream=stream,
        )

    @cute.jit
    def weights(self, mixes, mScale, mBase, pre, mPost, mComb, token, valid):
        """One token's scalar math (one lane): pre into `pre`, post/comb written to global."""
        n_mix = self.n_mix
        r = cute.math.rsqrt(mixes[n_mix] / (HC * self.d) + self.norm_eps)
        for i in cutlass.range_constexpr(HC):
            pre[i] = _sigmoid(mixes[i] * r * mScale[0] + mBase[i]) + self.hc_eps
        if cutlass.const_expr(not self.head):
            c = cute.make_rmem_tensor((HC * HC,), Float32)
            for j in cutlass.range_constexpr(HC):
                row_max = -Float32.inf
                for k in cutlass.range_constexpr(HC):
                    c[j * HC + k] = mixes[2 * HC + j * HC + k] * r * mScale[2] + mBase[2 * HC + j * HC + k]
                    row_max = cute.arch.fmax(row_max, c[j * HC + k])
                row_sum = Float32(0.0)
                for k in cutlass.range_constexpr(HC):
                    c[j * HC + k] = cute.math.exp(c[j * HC + k] - row_max)
                    row_sum += c[j * HC + k]
                for k in cutlass.range_constexpr(HC):
                    c[j * HC + k] = c[j * HC + k] / row_sum + self.hc_eps
            self.normalise(c, False)
            for _ in cutlass.range(self.iters - 1, unroll=1):
                self.normalise(c, True)
                self.normalise(c, False)
            if valid:
                for i in cutlass.range_constexpr(HC):
                    mPost[token, i] = 2.0 * _sigmoid(mixes[HC + i] * r * mScale[1] + mBase[HC + i])
                for i in cutlass.range_constexpr(HC * HC):
                    mComb[token, i] = c[i]

    @cute.jit
    def normalise(self, c, rows: cutlass.Constexpr):
        """Divide each row (rows=True, sum over k) or column (sum over j) of the 4x4 by its sum + eps."""
        for a in cutlass.range_constexpr(HC):
            total = Float32(0.0)
            for b in cutlass.range_constexpr(HC):
                total += c[a * HC + b] if cutlass.const_expr(rows) else c[b * HC + a]
            total = total + self.hc_eps
            for b in cutlass.range_constexpr(HC):
                if cutlass.const_expr(rows):
                    c[a * HC + b] = c[a * HC + b] / total
                else:
                    c[b * HC + a] = c[b * HC + a] / total

    @cute.kernel
    def kernel(self, mPart: cute.Tensor, mX: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
               mY: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor):
        n_mix, v = self.n_mix, self.vec
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n_tokens = mX.shape[0]
        first = bidx * TOKENS
        smem = memory.SmemAllocator()
        s_mix = smem.allocate_tensor(Float32, cute.make_layout((n_mix + 1, TOKENS), stride=(TOKENS, 1)), 16)
        s_pre = smem.allocate_tensor(Float32, cute.make_layout((HC, TOKENS), stride=(TOKENS, 1)), 16)

        token = first + lane
        for m in cutlass.range_constexpr(-(-(n_mix + 1) // (THREADS // 32))):
            mix = warp + (THREADS // 32) * m
            if mix < n_mix + 1:
                total = Float32(0.0)
                if token < n_tokens:
                    for s in cutlass.range(mPart.shape[0], unroll=4):
                        total += mPart[s, mix, token]
                s_mix[mix, lane] = total
        cute.arch.barrier()

        if warp == 0:
            mixes = cute.make_rmem_tensor((n_mix + 1,), Float32)
            for m in cutlass.range_constexpr(n_mix + 1):
                mixes[m] = s_mix[m, lane]
            pre = cute.make_rmem_tensor((HC,), Float32)
            self.weights(mixes, mScale, mBase, pre, mPost, mComb, token, token < n_tokens)
            for i in cutlass.range_constexpr(HC):
                s_pre[i, lane] = pre[i]
        cute.arch.barrier()

        gX = cute.zipped_divide(mX, (1, 1, v))  # ((1,1,v), (T, HC, D/v))
        gY = cute.zipped_divide(mY, (1, v))
        raw = cute.make_rmem_tensor((v,), mX.element_type)
        out = cute.make_rmem_tensor((v,), mY.element_type)
        for tok in cutlass.range(TOKENS, unroll=1):
            t = first + tok
            if t < n_tokens:
                for j in cutlass.range_constexpr(self.vecs_per_thread):
                    col = tidx + THREADS * j
                    if col < self.d // v:
                        y = cute.make_rmem_tensor((v,), Float32)
                        y.fill(0.0)
                        for i in cutlass.range_constexpr(HC):
                            cute.autovec_copy(gX[(0, 0, None), (t, i, col)], raw)
                            y.store(y.load() + s_pre[i, tok] * raw.load().to(Float32))
                        out.store(y.load().to(mY.element_type))
                        cute.autovec_copy(out, gY[(0, None), (t, col)])
