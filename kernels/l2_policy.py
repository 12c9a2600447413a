"""L2 cache policies for the accesses that take one (TMA copies, cp.async and ld / st with a cache hint)."""

from __future__ import annotations

from cutlass import Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def l2_policy(priority: str, *, loc=None, ip=None) -> Int64:
    """A 64-bit L2 cache policy that gives every access it tags `priority` (evict_first / evict_last;
    createpolicy.fractional, fraction 1; sm_80+)."""
    return Int64(llvm.inline_asm(
        T.i64(), [], f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;", "=l",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    ))
