"""The layer's masked dispatch in one launch (candidate `cutedsl:fused-dispatch`): the layout and the gather + FP8
quantisation of kernels/moe/dispatch.py's two kernels, for the masked layout whose padding rows stay unwritten
(skip_padding, the layer's).

At decode the T·k assignments are few (6-384), so each assignment's row group finds its own row: its lanes count
the earlier assignments to the same expert (rank r, in (t, k) order: oracles/moe.py `dispatch_layout`), the row is
e·max_m + r (-1 past max_m or for an id that is no expert), its first lane writes pos, src, expert and row_weight,
and the group quantises x[t] into it as the gather does. CTAs past the assignments' count the experts (one a
thread): counts[e] is the true count, as the layout kernel writes it (the glue raises past max_m). Padding rows'
src / expert / row_weight are not written either: the grouped GEMMs never read a row past its expert's count.
One launch less than the two-kernel dispatch: ~2-3 us a decode step (the gather's launch and drain). But each row
group scans its earlier assignments and each counting thread all of them, serially: O(T·k) loads where the two
kernels do O(1). The layer launches it up to MAX_ASSIGNMENTS (v14, kernels/moe/layer.py): H200, one process, the
rule then at every T 1.036-1.042x at T = 1, 1.00-1.01x at T = 8 (48 assignments), 0.92-0.99x at T = 64 (384).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass import memory

from kernels.moe.dispatch import GATHER_CTA, VEC, WAVE_CTAS, GatherQuantKernel

WARP = 32
MAX_ASSIGNMENTS = 64  # T·k up to which the layer launches it (measured: 48 gains, 384 loses; the O(T·k) scans)


class FusedMaskedDispatch(GatherQuantKernel):
    """Compile-time: experts E, top-k, D, pdl (trigger the dependents at the start: L1 may take SMs as these CTAs
    exit), early_x (v29, the layer's since session 49: a row group loads its token's first vector of x before it
    ranks itself: the token is its assignment's, t = i // k, so the load need not wait for the rank's loads; one
    round trip off the chain). Runtime: tokens, layout rows (E · max_m). The jitted call has Dispatch's signature."""

    def __init__(self, n_experts: int, topk: int, d: int, pdl: bool = False, early_x: bool = False):
        super().__init__(d, skip_padding=True, pdl=False, trigger=pdl, by_assignment=True, topk=topk)
        self.n_experts, self.early_x = n_experts, early_x
        self.warps_per_row = max(self.tpr // WARP, 1)

    @cute.jit
    def __call__(self, mX, mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW, mCodes, mScales, stream):
        assign = cute.ceil_div(mPos.shape[0], self.rows_per_cta)
        counting = (self.n_experts + GATHER_CTA - 1) // GATHER_CTA
        cols = Int32(1)
        if assign * self.vecs <= WAVE_CTAS:
            cols = Int32(self.vecs)
        self.fused(mX, mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW, mCodes, mScales).launch(
            grid=[assign + counting, cols, 1], block=[GATHER_CTA, 1, 1], stream=stream)

    @cute.kernel
    def fused(self, mX, mIdx, mW, mCounts, mPos, mSrc, mExpert, mRowW, mCodes, mScales):
        if cutlass.const_expr(self.trigger):
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, col, _ = cute.arch.block_idx()
        _, cols, _ = cute.arch.grid_dim()
        smem = memory.SmemAllocator()
        s_red = smem.allocate_tensor(Int32, cute.make_layout((GATHER_CTA // WARP,)), byte_alignment=16)
        n = mIdx.shape[0]
        assign = (n + self.rows_per_cta - 1) // self.rows_per_cta
        if bidx >= assign:  # the experts' counts (a CTA-uniform branch)
            e = (bidx - assign) * GATHER_CTA + tidx
            if (col == 0) & (e < self.n_experts):
                count = Int32(0)
                for i in cutlass.range(0, n, unroll=1):
                    if mIdx[i] == e:
                        count += 1
                mCounts[e] = count
        else:
            self._assignment(mX, mIdx, mW, mPos, mSrc, mExpert, mRowW, mCodes, mScales, s_red, tidx, col, cols)

    @cute.jit
    def _assignment(self, mX, mIdx, mW, mPos, mSrc, mExpert, mRowW, mCodes, mScales, s_red, tidx, col, cols):
        """Assignment i = this row group's: its rank among its expert's earlier assignments (a sum over the group's
        lanes), its row, the row's side data (lane 0 of grid column 0) and its FP8 codes and scales."""
        i, lane = self.row_and_lane()
        n = mIdx.shape[0]
        rows = mSrc.shape[0]
        max_m = rows // self.n_experts
        e = Int32(-1)
        if i < n:
            e = mIdx[i]
        if cutlass.const_expr(self.early_x):  # vector column `col` of x[i // k], loaded before the rank (a row group
            x_col = cute.make_rmem_tensor((VEC,), mX.element_type)  # past the assignments loads the last one's)
            cute.autovec_copy(cute.zipped_divide(mX, (1, VEC))[(0, None), (cutlass.min(i, n - 1) // self.topk,
                                                                         self.vec(col, lane))], x_col)
        before = Int32(0)
        for j in cutlass.range(lane, cutlass.min(i, n), self.tpr, unroll=1):  # i's earlier ones, striped over the lanes
            if mIdx[j] == e:
                before += 1
        before = cute.arch.warp_reduction_sum(before, threads_in_group=min(self.tpr, WARP))
        if cutlass.const_expr(self.tpr > WARP):  # a row group of several warps: their sums meet in shared memory
            if lane % WARP == 0:
                s_red[tidx // WARP] = before
            cute.arch.barrier()
            first = tidx // self.tpr * self.warps_per_row
            before = s_red[first]
            for w in cutlass.range_constexpr(1, self.warps_per_row):
                before += s_red[first + w]
        row = Int32(-1)
        if (e >= 0) & (e < self.n_experts) & (before < max_m):
            row = e * max_m + before
        t = Int32(-1)
        if row >= 0:
            t = i // self.topk
        if (lane == 0) & (col == 0) & (i < n):
            mPos[i] = row
            if row >= 0:
                mSrc[row] = t
                mExpert[row] = e
                mRowW[row] = mW[i]
        per_group = rows // mScales.shape[0]
        if cutlass.const_expr(self.early_x):  # column `col` from the early load (t >= 0 is t = i // k), the rest here
            self._quantise(x_col, mCodes, mScales, t, row, col, lane, per_group, t >= 0)
            for v in cutlass.range(col + cols, self.vecs, cols, unroll=1):
                self._vector(mX, mCodes, mScales, t, row, v, lane, per_group, t >= 0)
        else:
            for v in cutlass.range(col, self.vecs, cols, unroll=1):
                self._vector(mX, mCodes, mScales, t, row, v, lane, per_group, t >= 0)
