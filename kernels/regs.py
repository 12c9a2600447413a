"""Register-fragment helpers shared by the wgmma kernels (fmha, gemm): the (rows, cols) view of an
SM90 accumulator, and pinning values at a program point (CUTLASS's warpgroup_fence_operand)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def mn_view(acc: cute.Tensor) -> cute.Tensor:
    """SM90 accumulator ((2,2,V),M,N) viewed as (rows, cols) of this thread: ((2,M),(2,V,N))."""
    cm = cute.make_layout(acc.layout.shape)
    mn = cute.make_layout(
        ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[0][2], cm.shape[2])),
        stride=((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[0][2], cm.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


@dsl_user_op
def pin(x: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """An empty volatile asm that takes and returns x: whatever computes x runs before it, and
    whatever reads the result runs after it."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [x.ir_value(loc=loc, ip=ip)], "", "=r,0", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@cute.jit
def fence_operand(frag: cute.Tensor):
    """Pin every register of a fragment at this point (CUTLASS's warpgroup_fence_operand). The
    compiler otherwise moves register work across wgmma issues and waits: fmha's P conversion sank
    between the wgmma issues (ptxas injected a warpgroup.arrive before each, C7519); gemm's
    promotion reads of a temporary crossed the wgmma wait (ptxas serialised every wgmma, C7514)."""
    words = cute.recast_tensor(frag, cutlass.Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = pin(words[i])
