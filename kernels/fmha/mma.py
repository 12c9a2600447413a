"""The consumers' tensor-core side: register fragment views, the wgmma issue of S = Q K^T and
O += P V, and the waits and releases of the K/V smem stages (mbarrier layout: barriers.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from kernels.regs import fence_operand


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """C fragment ((2,2,N/8),M,1) of a 64xN bf16 tile as the A fragment ((2,2,2),M,N/16) of PV."""
    l = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    lay = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=(
            (l.stride[0][0], l.stride[0][1], l.stride[0][2][0]),
            l.stride[1],
            (l.stride[0][2][1], l.stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, lay)


class Mma:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _issue_qk(self, qk_mma, acc_S, tSrQ, tSrK, stage, dsplit, n_kb: int):
        """Queue S += Q K^T of the tile in `stage` over this warpgroup's slice of d (no wait)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(n_kb):
            k = dsplit * n_kb + kb
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_S)
        warpgroup.commit_group()

    @cute.jit
    def _pv(self, mma, acc_O, tA, tOrV, stage: int, a_in_registers: bool):
        if cutlass.const_expr(a_in_registers):
            fence_operand(tA)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            cute.gemm(mma, acc_O, tA[None, None, kb], tOrV[None, None, kb, stage], acc_O)
        warpgroup.commit_group()

    @cute.jit
    def _wait_k(self, bars, kt):
        S = self.cfg.stages
        cute.arch.mbarrier_wait(bars + kt % S, (kt // S) & 1)
        if cutlass.const_expr(not self.cfg.tma_kv):  # TMA writes are the async proxy's already
            cute.arch.fence_proxy("async.shared", space="cta")  # cp.async writes -> wgmma reads

    @cute.jit
    def _wait_v(self, bars, kt):
        """V of tile kt is in smem (when V is K, its K wait covered it)."""
        S = self.cfg.stages
        if cutlass.const_expr(not self.cfg.kv_shared):
            cute.arch.mbarrier_wait(bars + 2 * S + kt % S, (kt // S) & 1)
            if cutlass.const_expr(not self.cfg.tma_kv):
                cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def _release_k(self, bars, kt):
        """The mask has read tile kt's indices and QK its K rows; when V is K, PV still needs them."""
        if cutlass.const_expr(not self.cfg.kv_shared):
            cute.arch.mbarrier_arrive(bars + self.cfg.stages + kt % self.cfg.stages)

    @cute.jit
    def _release_v(self, bars, kt):
        S = self.cfg.stages
        cute.arch.mbarrier_arrive(bars + (S if self.cfg.kv_shared else 3 * S) + kt % S)
