"""The inline PTX of the FP8 decode's producer (decode_prefetch.py): the e4m3 -> bf16 bit conversion,
hinted row loads, L2 prefetches and 16-byte shared stores (local, and into the peer CTA) whose
immediate offsets stay in the instruction (a computed address per store cost ~8 instructions)."""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# a real load that pulls the rest of its 256-byte block into L2 (FlashMLA's hint; +3-7% at h_q 64 over
# plain loads in one process, docs/perf/fmha.md); .nc: the caches are read-only for the kernel's life
LOAD_HINT = ".nc.L2::256B"


def _asm(ret, args, text: str, cons: str, pure: bool = False):
    return llvm.inline_asm(ret, args, text, cons, has_side_effects=not pure, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def _v(x, ty, loc, ip):
    return ty(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def e4m3x2_to_bf16x2(w, sel: int, scale2, *, loc=None, ip=None) -> Int32:
    """Two e4m3 codes (bytes of w picked by the prmt selector `sel`: 0x9180 bytes 0-1, 0xB3A2 bytes
    2-3) -> bf16x2 of code * 2^(e - 127), scale2 = bf16x2 of 2^(e - 7): prmt puts each byte under a
    copy of its sign (0xSSbb), << 4 and the mask 0x87f0 leave sign | exponent-and-mantissa << 4, which
    read as a bf16 is the code * 2^-120 for every e4m3 value (subnormals and zero included; NaN codes
    become finite), then one mul.rn.bf16x2. Exact while e <= 134 (2^(e - 7) a finite bf16); the bf16
    product of a code subnormal at 2^-120 relies on bf16 mul keeping subnormals."""
    return Int32(_asm(T.i32(), [_v(w, Int32, loc, ip), _v(scale2, Int32, loc, ip)],
                      "{\n.reg .b32 t;\n"
                      f"prmt.b32 t, $1, 0, {sel:#x};\n"
                      "shl.b32 t, t, 4;\nand.b32 t, t, 0x87f087f0;\nmul.rn.bf16x2 $0, t, $2;\n}", "=r,r,r", pure=True))


@dsl_user_op
def prmt(a, b, sel: int, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(a, Int32, loc, ip), _v(b, Int32, loc, ip)], f"prmt.b32 $0, $1, $2, {sel:#x};",
                      "=r,r,r", pure=True))


@dsl_user_op
def ld_b64(addr, imm: int, *, loc=None, ip=None) -> Int64:
    return Int64(_asm(T.i64(), [_v(addr, Int64, loc, ip)], f"ld.global{LOAD_HINT}.b64 $0, [$1+{imm}];", "=l,l"))


@dsl_user_op
def ld_b32(addr, imm: int, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip)], f"ld.global{LOAD_HINT}.b32 $0, [$1+{imm}];", "=r,l"))


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None) -> None:
    """prefetch.global.L2 of the line holding `addr`."""
    _asm(None, [_v(addr, Int64, loc, ip)], "prefetch.global.L2 [$0];", "l")


@dsl_user_op
def mapa_u32(addr, rank, *, loc=None, ip=None) -> Int32:
    """The shared::cluster address of this CTA's shared address `addr` in CTA `rank` of the cluster."""
    return Int32(_asm(T.i32(), [_v(addr, Int32, loc, ip), _v(rank, Int32, loc, ip)],
                      "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", pure=True))


@dsl_user_op
def st_shared_v4(addr, imm: int, w, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int32, loc, ip)] + [_v(x, Int32, loc, ip) for x in w],
         f"st.shared.v4.b32 [$0+{imm}], {{$1, $2, $3, $4}};", "r,r,r,r,r")


@dsl_user_op
def st_async_v4(addr, imm: int, w, bar, *, loc=None, ip=None) -> None:
    """16 bytes into another CTA's shared memory (shared::cluster addresses), completing them on its
    barrier `bar` (complete_tx)."""
    _asm(None, [_v(addr, Int32, loc, ip)] + [_v(x, Int32, loc, ip) for x in w] + [_v(bar, Int32, loc, ip)],
         f"st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [$0+{imm}], {{$1, $2, $3, $4}}, [$5];",
         "r,r,r,r,r,r")
