"""L2 cache policies for the accesses that take one (TMA copies, cp.async with a cache hint)."""

from __future__ import annotations

from cutlass import Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def l2_evict_last_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache policy: every access it tags is evict_last (createpolicy.fractional, fraction 1)."""
    return Int64(llvm.inline_asm(
        T.i64(), [], "createpolicy.fractional.L2::evict_last.b64 $0, 1.0;", "=l",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def l2_evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache policy: every access it tags is evict_first (read once: Q, a decode step's weights)."""
    return Int64(llvm.inline_asm(
        T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))
