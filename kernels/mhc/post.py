"""mHC hc_post in CuTeDSL (spec §3.4): expand the sublayer output and mix the residual streams.

    out[t, k] = post[t, k]·o[t] + Σ_j comb[t, j, k]·residual[t, j]     (fp32, one cast)

Memory-bound: per token read o (D) and the 4 residual streams, write 4 streams. A CTA owns one
token: the 20 weights are loaded once (16-byte vectors, broadcast), then each of the 128 threads
streams its 16-byte column vectors of o and the residual and writes the 4 outputs.
One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

HC = 4
THREADS = 128


class HcPostKernel:
    """Compile-time: D. Tokens are a runtime size."""

    def __init__(self, d: int):
        if d % 8:
            raise ValueError(f"mHC needs D % 8 == 0, got {d}")
        self.d, self.vec = d, 8
        self.vecs_per_thread = -(-(d // self.vec) // THREADS)

    @cute.jit
    def __call__(self, mO: cute.Tensor, mRes: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor,
                 mOut: cute.Tensor, stream):
        self.kernel(mO, mRes, mPost, mComb, mOut).launch(grid=[mO.shape[0], 1, 1], block=[THREADS, 1, 1],
                                                         stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mRes: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor,
               mOut: cute.Tensor):
        v = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        post = cute.make_rmem_tensor((HC,), Float32)
        comb = cute.make_rmem_tensor(cute.make_layout((HC, HC), stride=(HC, 1)), Float32)  # comb[j, k]: weight of residual stream j in output k
        cute.autovec_copy(cute.zipped_divide(mPost, (1, HC))[(0, None), (t, 0)], post)
        gC = cute.zipped_divide(mComb, (1, HC))
        for j in cutlass.range_constexpr(HC):
            cute.autovec_copy(gC[(0, None), (t, j)], comb[j, None])
        gO = cute.zipped_divide(mO, (1, v))
        gR = cute.zipped_divide(mRes, (1, 1, v))
        gOut = cute.zipped_divide(mOut, (1, 1, v))
        raw = cute.make_rmem_tensor((v,), mO.element_type)
        out = cute.make_rmem_tensor((v,), mOut.element_type)
        for j in cutlass.range_constexpr(self.vecs_per_thread):
            col = tidx + THREADS * j
            if col < self.d // v:
                cute.autovec_copy(gO[(0, None), (t, col)], raw)
                o = raw.load().to(Float32)
                res = []
                for i in cutlass.range_constexpr(HC):
                    cute.autovec_copy(gR[(0, 0, None), (t, i, col)], raw)
                    res.append(raw.load().to(Float32))
                for k in cutlass.range_constexpr(HC):
                    y = o * post[k]
                    for i in cutlass.range_constexpr(HC):
                        y = y + res[i] * comb[i, k]
                    out.store(y.to(mOut.element_type))
                    cute.autovec_copy(out, gOut[(0, 0, None), (t, k, col)])
