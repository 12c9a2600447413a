"""MoE combine in CuTeDSL: the routed experts' outputs, rows of a dispatch layout (bf16 [rows, D]), back
to token order, plus the shared expert's output (spec §8.3):

    y[t] = bf16( Σ_{j<k, pos[t,j] >= 0} rows[pos[t, j]] + shared[t] )     accumulated in fp32

pos [T, k] is the dispatch's (kernels/moe/dispatch.py). There are no weights here: the route weight
multiplies the SwiGLU output before w2 (§8.2; it matters for w2's FP8 activation quantisation), so
the rows come weighted. Memory-bound: `threads_per_row` threads a token, each CTA one of the row's `vecs`
16-byte vector columns (grid y), so a thread's k + 1 scattered loads are issued together and are its one round
trip. With the columns in a loop (one CTA a row pair) a decode token paid `vecs` round trips in series: Pro (7
columns) 7.5 us at T = 1, 11 us at T = 8-64 (docs/perf/moe.md "combine and gather").
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from kernels.moe.dispatch import GATHER_CTA, VEC, RowKernel


class CombineKernel(RowKernel):
    """Compile-time: D, top-k, pdl (launched with programmatic dependent launch, after L2), early (pdl only: the
    token's pos and shared output, complete before the layer's L1 began, read before griddepcontrol.wait, so only
    the rows' loads follow it; v29, the layer's since session 49). Runtime: tokens, layout rows."""

    def __init__(self, d: int, topk: int, pdl: bool = False, early: bool = False):
        if topk < 1:
            raise ValueError(f"topk={topk} must be positive")
        if early and not pdl:
            raise ValueError("early reads are a mode of the PDL launch (pdl)")
        super().__init__(d)
        self.topk, self.pdl, self.early = topk, pdl, early

    @cute.jit
    def __call__(self, mRows, mPos, mShared, mY, stream):
        self.kernel(mRows, mPos, mShared, mY).launch(
            grid=[cute.ceil_div(mY.shape[0], self.rows_per_cta), self.vecs, 1], block=[GATHER_CTA, 1, 1], stream=stream,
            use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mRows, mPos, mShared, mY):
        if cutlass.const_expr(self.pdl and not self.early):
            cute.arch.griddepcontrol_wait()
        t, lane = self.row_and_lane()
        _, v, _ = cute.arch.block_idx()  # the vector column of the row
        if t < mY.shape[0]:
            r_tiles = cute.zipped_divide(mRows, (1, VEC))
            s_tiles = cute.zipped_divide(mShared, (1, VEC))
            y_tiles = cute.zipped_divide(mY, (1, VEC))
            parts = [cute.make_rmem_tensor((VEC,), mRows.element_type) for _ in range(self.topk + 1)]
            out = cute.make_rmem_tensor((VEC,), mY.element_type)
            vec = v * self.tpr + lane
            cute.autovec_copy(s_tiles[(0, None), (t, vec)], parts[self.topk])
            early_pos = [None] * self.topk
            if cutlass.const_expr(self.early):  # dispatch's pos and the shared output are in before L1 began
                for j in cutlass.range_constexpr(self.topk):
                    early_pos[j] = mPos[t, j]
                cute.arch.griddepcontrol_wait()
            for j in cutlass.range_constexpr(self.topk):
                pos = early_pos[j] if cutlass.const_expr(self.early) else mPos[t, j]
                parts[j].fill(0)
                if pos >= 0:
                    cute.autovec_copy(r_tiles[(0, None), (pos, vec)], parts[j])
            acc = parts[0].load().to(Float32)
            for j in cutlass.range_constexpr(1, self.topk + 1):
                acc = acc + parts[j].load().to(Float32)
            out.store(acc.to(mY.element_type))
            cute.autovec_copy(out, y_tiles[(0, None), (t, vec)])

