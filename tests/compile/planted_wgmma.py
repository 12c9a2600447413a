"""A tiny SM90 warpgroup-MMA kernel for the `wgmma-serialized` lint (ptxas C7520, C7519).

One warpgroup multiplies a 64x64 A by a 64x64 B (bf16, K-major, both in shared memory) `n` times
into an fp32 accumulator that it rescales before each MMA (as attention rescales O). Branch modes:
  None         the correct twin: the wgmmas are issued unconditionally; ptxas says nothing
  "divergent"  the planted bug: each wgmma sits under a thread-dependent runtime branch
               (`if tidx < flag:`); ptxas serializes every wgmma of the kernel (C7520, "program
               dependence on compiler-inserted WG.AR in divergent path"), as it did for the SM90
               attention kernel's `if pair + 1 < n_pairs:` before the last pair was peeled
  "uniform"    the wgmmas under a uniform runtime branch (`if flag > 0:`): ptxas only injects a
               warpgroup.arrive (C7519), a note, not a failure
Compiles on a CPU for sm_90a; never run.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor
from cutlass.utils import LayoutEnum

from kernels.common import compile_kernel

M = N = K = 64
MODES = (None, "divergent", "uniform")


class WgmmaLoop:
    def __init__(self, branch: str | None):
        assert branch in MODES
        self.branch = branch

    @cute.jit
    def __call__(self, mC: cute.Tensor, n: cutlass.Int32, flag: cutlass.Int32, stream):
        dt = cutlass.BFloat16
        mma = sm90_utils.make_trivial_tiled_mma(dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                                               cutlass.Float32, (1, 1, 1), (M, N))
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (M, N, K), dt, 1)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (M, N, K), dt, 1)

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sB_layout)], 1024]

        self.kernel(mC, n, flag, mma, sA_layout, sB_layout, Storage).launch(
            grid=[1, 1, 1], block=[128, 1, 1], smem=Storage.size_in_bytes(), stream=stream)

    @cute.jit
    def _mma(self, mma, acc, tCrA, tCrB):
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        warpgroup.commit_group()

    @cute.kernel
    def kernel(self, mC: cute.Tensor, n: cutlass.Int32, flag: cutlass.Int32, mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, Storage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        st = cutlass.utils.SmemAllocator().allocate(Storage)
        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)[None, None, 0]
        sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)[None, None, 0]
        thr = mma.get_slice(tidx)
        tCrA = mma.make_fragment_A(thr.partition_A(sA))
        tCrB = mma.make_fragment_B(thr.partition_B(sB))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((M, N)), cutlass.Float32)
        acc.fill(0.0)
        mma.set(warpgroup.Field.ACCUMULATE, True)
        for _ in cutlass.range(n, unroll=1):
            for j in cutlass.range_constexpr(cute.size(acc)):  # rescale the accumulator between MMAs
                acc[j] = acc[j] * 0.5
            if cutlass.const_expr(self.branch == "divergent"):
                if tidx < flag:  # the planted bug: a wgmma under a thread-dependent runtime branch
                    self._mma(mma, acc, tCrA, tCrB)
            elif cutlass.const_expr(self.branch == "uniform"):
                if flag > 0:
                    self._mma(mma, acc, tCrA, tCrB)
            else:
                self._mma(mma, acc, tCrA, tCrB)
            warpgroup.wait_group(0)
        tCgC = thr.partition_C(mC)
        for i in cutlass.range_constexpr(cute.size(acc)):
            tCgC[i] = acc[i]


def compile_wgmma(branch: str | None, arch: str = "sm_90a"):
    c = make_fake_compact_tensor(cutlass.Float32, (M, N), stride_order=(1, 0), assumed_align=16)
    return compile_kernel(WgmmaLoop(branch), c, cutlass.Int32(1), cutlass.Int32(1), arch=arch)
