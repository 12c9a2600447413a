"""mHC pass 2 in CuTeDSL (spec §3.3, §3.5): reduce the mix partials, turn them into the stream
weights, and collapse the 4 streams.

    mixes = (Σ_s part[t, s, :24]) · rsqrt(Σ_s part[t, s, 24] / 4D + eps)
    hc_pre:  pre = sigmoid(mixes[:4]·scale0 + base) + eps;  post = 2·sigmoid(mixes[4:8]·scale1 + base)
             comb = Sinkhorn(mixes[8:]·scale2 + base)  (row softmax + eps, column normalise, then 19 x
             row/column normalise, each dividing by sum + eps: the kernel's op order)
    hc_head: pre = sigmoid(mixes·scale + base) + eps
    y[t] = Σ_i pre_i · X[t, i]  (fp32, one cast)

v2: a 2-D grid, (column blocks [+ 1 weights CTA]) × token blocks, so that decode fills the GPU.
- A column block is 128 vectors of 8 columns (one 16-byte vector per thread per stream); D/1024
  blocks (Pro 7, Flash 4). The token block (at most 32) is chosen at run time from T so that the
  grid has ~2 CTAs per SM of a 132-SM H100: Pro T = 64 → 1 token × 7 columns = 448 CTAs;
  T = 4096 → 32 tokens × 7 = 896 CTAs.
- Every CTA reduces its tokens' partials itself (the token block's partials are contiguous in the
  [T, splits, n_mix+1] layout pass 1 writes): the region is staged in shared memory by all 128
  threads with 4-byte cp.async (one round trip per 24 KB), then one thread per (token, mix) sums
  its splits in order s = 0, 1, … (the v1 order: mixes, pre, post, comb are bit-identical).
- Streaming CTAs compute only pre (a few sigmoids) and collapse; the Sinkhorn and the post/comb
  writes belong to one extra CTA per token block (hc_pre: grid x = 0), so they run beside the
  streaming instead of in front of it, and each token's post/comb is written exactly once. The
  Sinkhorn runs on 16 lanes per token (one comb element each, sums by butterfly): its 39
  normalisations are one division per lane, not 16 in a row on one lane.
- The collapse issues all 4 streams' vectors of 4 tokens before consuming them; the first group
  is issued before the partials phase, so at decode the residual and partial loads overlap.
One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32, cute, memory
from cutlass.cute.nvgpu import cpasync

HC = 4
TOKENS = 32  # most tokens per CTA (one lane per token for the scalar math)
THREADS = 128
VEC = 8  # bf16 columns per 16-byte vector
COLS = THREADS * VEC  # columns per column block
GROUP = 4  # tokens whose 4 streams are loaded before any is consumed
STAGE = THREADS * 48  # fp32 partials staged in shared memory per round trip (24 KB)
TARGET_CTAS = 264  # two CTAs per SM of a 132-SM H100


def _add(a, b):
    return a + b


def _sigmoid(z):
    return 1.0 / (1.0 + cute.math.exp(-z))


def column_blocks(d: int) -> int:
    return -(-d // COLS)


def token_block(n_tok, d: int):
    """Tokens per CTA at n_tok tokens (a Python int, or the kernel's run-time Int32): the most (<= 32)
    that still leave ⌈TARGET_CTAS / column blocks⌉ token blocks, so the grid has ~2 CTAs per SM."""
    per_block = -(-TARGET_CTAS // column_blocks(d))
    return cutlass.max(cutlass.min(n_tok // per_block, TOKENS), 1)


class HcApplyKernel:
    """Compile-time: head (hc_head) or pre (hc_pre), D, splits of pass 1, Sinkhorn iterations, eps,
    and whether the launch is a programmatic dependent launch (pdl: it may start while pass 1 runs;
    off only to measure what it buys: the declared variant cutedsl:no-pdl, kernels/mhc/variants.py)."""

    def __init__(
        self,
        head: bool,
        d: int,
        splits: int,
        iters: int = 20,
        hc_eps: float = 1e-6,
        norm_eps: float = 1e-6,
        pdl: bool = True,
    ):
        if d % VEC:
            raise ValueError(f"mHC needs D % 8 == 0, got {d}")
        self.head, self.d, self.splits, self.iters, self.pdl = head, d, splits, iters, pdl
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.n_mix = HC if head else (2 + HC) * HC
        self.col_blocks = column_blocks(d)
        self.extra = (
            0 if head else 1
        )  # the weights CTA of each token block (post, comb)
        # (token, mix) pairs per thread when a CTA reduces TOKENS tokens
        self.pairs_per_thread = -(-(TOKENS * (self.n_mix + 1)) // THREADS)

    @cute.jit
    def __call__(
        self,
        mPart: cute.Tensor,
        mX: cute.Tensor,
        mScale: cute.Tensor,
        mBase: cute.Tensor,
        mY: cute.Tensor,
        mPost: cute.Tensor,
        mComb: cute.Tensor,
        stream,
    ):
        n_tok = mX.shape[0]
        tb = token_block(n_tok, self.d)
        self.kernel(mPart, mX, mScale, mBase, mY, mPost, mComb, Int32(tb)).launch(
            grid=[self.col_blocks + self.extra, cute.ceil_div(n_tok, tb), 1],
            block=[THREADS, 1, 1],
            stream=stream,
            use_pdl=self.pdl,  # may start while pass 1 runs: x streams in, griddepcontrol.wait guards the partials
        )

    @cute.jit
    def pre_weights(self, mixes, mScale, mBase, pre):
        """One token's pre (one lane); returns r, the RMS factor."""
        r = cute.math.rsqrt(mixes[self.n_mix] / (HC * self.d) + self.norm_eps)
        for i in cutlass.range_constexpr(HC):
            pre[i] = _sigmoid(mixes[i] * r * mScale[0] + mBase[i]) + self.hc_eps

    @cute.jit
    def post_comb(self, s_mix, mScale, mBase, mPost, mComb, first, n):
        """post and the Sinkhorn comb of the CTA's n tokens, written to global: a half-warp per token,
        lane e holding comb[e // 4, e % 4]; row sums are a butterfly over lanes 1, 2 and column sums
        over lanes 4, 8, so a normalisation is one division per lane (one lane per token did 16)."""
        tidx, _, _ = cute.arch.thread_idx()
        e = tidx % (HC * HC)
        for p in cutlass.range(cute.ceil_div(n, THREADS // (HC * HC)), unroll=1):
            tl = p * (THREADS // (HC * HC)) + tidx // (HC * HC)
            valid = tl < n
            t = cutlass.select_(valid, tl, 0)  # lanes past n shuffle alongside, write nothing
            r = cute.math.rsqrt(s_mix[self.n_mix, t] / (HC * self.d) + self.norm_eps)
            c = s_mix[2 * HC + e, t] * r * mScale[2] + mBase[2 * HC + e]
            c = cute.math.exp(c - self.group_reduce(c, True, cute.arch.fmax))
            c = c / self.group_reduce(c, True, _add) + self.hc_eps
            c = c / (self.group_reduce(c, False, _add) + self.hc_eps)
            for _ in cutlass.range(self.iters - 1, unroll=1):
                c = c / (self.group_reduce(c, True, _add) + self.hc_eps)
                c = c / (self.group_reduce(c, False, _add) + self.hc_eps)
            if valid:
                mComb[first + tl, e] = c
                if e < HC:
                    mPost[first + tl, e] = 2.0 * _sigmoid(s_mix[HC + e, t] * r * mScale[1] + mBase[HC + e])

    @cute.jit
    def group_reduce(self, c, rows: cutlass.Constexpr, op):
        """op over the 4 lanes of c's row (rows=True: lane bits 0-1) or column (bits 2-3)."""
        for o in cutlass.range_constexpr(2):
            c = op(c, cute.arch.shuffle_sync_bfly(c, offset=(1 << o) if cutlass.const_expr(rows) else (HC << o)))
        return c

    @cute.jit
    def reduce_partials(self, mPart: cute.Tensor, s_stage, s_mix, first, n):
        """s_mix[m, tl] = Σ_s part[first + tl, s, m] (s in order) for the n tokens of this CTA."""
        m1, splits = self.n_mix + 1, self.splits
        tidx, _, _ = cute.arch.thread_idx()
        per_token = splits * m1
        region = n * per_token  # the CTA's partials: contiguous from token `first`
        src = mPart.iterator + first * per_token
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        acc = cute.make_rmem_tensor((self.pairs_per_thread,), Float32)
        acc.fill(0.0)
        for piece in cutlass.range(cute.ceil_div(region, STAGE), unroll=1):
            o = piece * STAGE
            for j in cutlass.range_constexpr(STAGE // THREADS):
                e = tidx + THREADS * j
                if o + e < region:
                    cute.copy(
                        atom,
                        cute.make_tensor(src + (o + e), cute.make_layout(1)),
                        cute.make_tensor(s_stage.iterator + e, cute.make_layout(1)),
                    )
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            for k in cutlass.range_constexpr(self.pairs_per_thread):
                p = tidx + THREADS * k
                if p < n * m1:
                    base = (
                        (p // m1) * per_token + p % m1 - o
                    )  # element s of the pair: base + m1·s
                    s_lo = Int32(0)
                    if base < 0:
                        s_lo = (m1 - 1 - base) // m1
                    s_hi = Int32(0)
                    if STAGE - base > 0:
                        s_hi = cutlass.min((STAGE - base + m1 - 1) // m1, splits)
                    total = acc[k]
                    for s in cutlass.range(s_lo, s_hi, unroll=8):
                        total += s_stage[base + m1 * s]
                    acc[k] = total
            cute.arch.barrier()
        for k in cutlass.range_constexpr(self.pairs_per_thread):
            p = tidx + THREADS * k
            if p < n * m1:
                s_mix[p % m1, p // m1] = acc[k]
        cute.arch.barrier()

    @cute.jit
    def load_group(self, gX, raw, t0, n_left, col):
        """Issue the 4 streams' vectors of tokens t0 .. t0+GROUP-1 (those < n_left from t0)."""
        for u in cutlass.range_constexpr(GROUP):
            if u < n_left:
                for i in cutlass.range_constexpr(HC):
                    cute.autovec_copy(
                        gX[(0, 0, None), (t0 + u, i, col)], raw[None, u * HC + i]
                    )

    @cute.kernel
    def kernel(
        self,
        mPart: cute.Tensor,
        mX: cute.Tensor,
        mScale: cute.Tensor,
        mBase: cute.Tensor,
        mY: cute.Tensor,
        mPost: cute.Tensor,
        mComb: cute.Tensor,
        tb: Int32,
    ):
        n_mix, v = self.n_mix, VEC
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        n_tokens = mX.shape[0]
        first = by * tb
        n = cutlass.min(tb, n_tokens - first)  # tokens of this CTA, 1..32
        smem = memory.SmemAllocator()
        s_stage = smem.allocate_tensor(Float32, cute.make_layout(STAGE), 16)
        s_mix = smem.allocate_tensor(
            Float32, cute.make_layout((n_mix + 1, TOKENS), stride=(TOKENS, 1)), 16
        )
        s_pre = smem.allocate_tensor(
            Float32, cute.make_layout((HC, TOKENS), stride=(TOKENS, 1)), 16
        )

        if bx < self.extra:
            # hc_pre's weights CTA: post and comb of the token block, one lane per token
            cute.arch.griddepcontrol_wait()  # pass 1 (the primary launch) has written every partial
            self.reduce_partials(mPart, s_stage, s_mix, first, n)
            self.post_comb(s_mix, mScale, mBase, mPost, mComb, first, n)
        else:
            col = (
                bx - self.extra
            ) * THREADS + tidx  # this thread's 16-byte column vector
            gX = cute.zipped_divide(mX, (1, 1, v))  # ((1,1,v), (T, HC, D/v))
            gY = cute.zipped_divide(mY, (1, v))
            raw = cute.make_rmem_tensor(
                cute.make_layout((v, GROUP * HC), stride=(1, v)), mX.element_type
            )
            out = cute.make_rmem_tensor((v,), mY.element_type)
            active = col < self.d // v
            if active:
                self.load_group(
                    gX, raw, first, n, col
                )  # in flight during the partials phase (and, launched early, during pass 1)
            cute.arch.griddepcontrol_wait()
            self.reduce_partials(mPart, s_stage, s_mix, first, n)
            if tidx < n:
                mixes = cute.make_rmem_tensor((n_mix + 1,), Float32)
                for m in cutlass.range_constexpr(n_mix + 1):
                    mixes[m] = s_mix[m, tidx]
                pre = cute.make_rmem_tensor((HC,), Float32)
                self.pre_weights(mixes, mScale, mBase, pre)
                for i in cutlass.range_constexpr(HC):
                    s_pre[i, tidx] = pre[i]
            cute.arch.barrier()
            if active:
                for g in cutlass.range(cute.ceil_div(n, GROUP), unroll=1):
                    tok = g * GROUP
                    if g > 0:
                        self.load_group(gX, raw, first + tok, n - tok, col)
                    for u in cutlass.range_constexpr(GROUP):
                        if u < n - tok:
                            y = cute.make_rmem_tensor((v,), Float32)
                            y.fill(0.0)
                            for i in cutlass.range_constexpr(HC):
                                y.store(
                                    y.load()
                                    + s_pre[i, tok + u]
                                    * raw[None, u * HC + i].load().to(Float32)
                                )
                            out.store(y.load().to(mY.element_type))
                            cute.autovec_copy(
                                out, gY[(0, None), (first + tok + u, col)]
                            )
