"""Embedding lookup into the hc residual streams in CuTeDSL (spec §3.1):

    out[t, k, :] = weight[ids[t], :]        k = 0..hc-1 (every stream is the embedding row)

Memory-bound: per token read one row of D values and write it hc = 4 times, 5·D·bytes moved. A CTA
owns one token: thread 0's id is read by every thread (a broadcast load), then each of the 128 threads
streams its 16-byte vectors of the row, each load stored to the 4 streams.

Ids follow torch's indexing, the oracle's `weight[ids]`: an id in [-V, 0) counts from the end, and an
id outside [-V, V) is an error. Here that error is a `trap`: the launch fails ("unspecified launch
failure") and takes the CUDA context with it, as torch's own CUDA gather fails with a device-side
assert. Never a read outside the table, and no host read of the ids on the decode path.
One source for sm_90a and sm_100a, any element type (the row is copied bit for bit).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

HC = 4
THREADS = 128
VEC_BYTES = 16


@dsl_user_op
def trap(*, loc=None, ip=None) -> None:
    """PTX `trap`: abort the launch (the grid stops, the host sees the launch fail)."""
    llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


class EmbedKernel:
    """Compile-time: D, hc and the element width; the vocabulary V and the tokens T are runtime sizes."""

    def __init__(self, d: int, elem_bytes: int = 2, hc: int = HC):
        self.vec = VEC_BYTES // elem_bytes
        if d % self.vec:
            raise ValueError(f"the embed kernel needs D % {self.vec} == 0 (16-byte rows), got {d}")
        self.d, self.hc = d, hc
        self.vecs_per_thread = -(-(d // self.vec) // THREADS)

    @cute.jit
    def __call__(self, mIds: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, stream):
        self.kernel(mIds, mW, mOut).launch(grid=[mIds.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mIds: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor):
        v = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        vocab = Int64(mW.shape[0])
        raw = Int64(mIds[t])
        wrapped = cutlass.select_(raw < Int64(0), raw + vocab, raw)  # torch's negative indexing
        if wrapped < Int64(0) or wrapped >= vocab:
            trap()  # (a device printf of the id would cost 24 B of local memory for its arguments)
        row = Int32(wrapped)
        gW = cute.zipped_divide(mW, (1, v))
        gOut = cute.zipped_divide(mOut, (1, 1, v))
        frag = cute.make_rmem_tensor((v,), mW.element_type)
        for j in cutlass.range_constexpr(self.vecs_per_thread):
            col = tidx + THREADS * j
            if col < self.d // v:
                cute.autovec_copy(gW[(0, None), (row, col)], frag)
                for k in cutlass.range_constexpr(self.hc):
                    cute.autovec_copy(frag, gOut[(0, 0, None), (t, k, col)])
