"""Inline PTX for 2-CTA clusters that share a tile through distributed shared memory: the peer's address of a local
shared address, and 16-byte stores into the peer that complete on its barrier (the FP8 decode's head pair,
kernels/fmha/decode_pair.py; the grouped expert GEMM's CTA pairs, kernels/moe/grouped_pair.py)."""

from __future__ import annotations

from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def inline_ptx(ret, args, text: str, cons: str, pure: bool = False):
    """One inline-PTX op (`pure`: no side effects, so the compiler may move or drop it)."""
    return llvm.inline_asm(ret, args, text, cons, has_side_effects=not pure, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def _v(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def mapa_u32(addr, rank, *, loc=None, ip=None) -> Int32:
    """The shared::cluster address of this CTA's shared address `addr` in CTA `rank` of the cluster."""
    return Int32(inline_ptx(T.i32(), [_v(addr, loc, ip), _v(rank, loc, ip)],
                      "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", pure=True))


@dsl_user_op
def st_async_v4(addr, imm: int, w, bar, *, loc=None, ip=None) -> None:
    """16 bytes into another CTA's shared memory (shared::cluster addresses), completing them on its
    barrier `bar` (complete_tx)."""
    inline_ptx(None, [_v(addr, loc, ip)] + [_v(x, loc, ip) for x in w] + [_v(bar, loc, ip)],
         f"st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [$0+{imm}], {{$1, $2, $3, $4}}, [$5];",
         "r,r,r,r,r,r")


@dsl_user_op
def bulk_copy_to_peer(dst, src, size: int, bar, *, loc=None, ip=None) -> None:
    """`size` bytes (a multiple of 16) of this CTA's shared memory at `src` into another CTA's at `dst` (shared::cluster)
    by the bulk-copy engine, completing them on its barrier `bar` (complete_tx); one thread issues it."""
    inline_ptx(None, [_v(dst, loc, ip), _v(src, loc, ip), _v(bar, loc, ip)],
               f"cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [$0], [$1], {size}, [$2];",
               "r,r,r")
