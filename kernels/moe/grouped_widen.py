"""The widening of the grouped expert GEMM (kernels/moe/grouped_sm90.py, a mixin of GroupedSm90; `self.cfg` is its
GroupedConfig): a stage's FP4 weight tile (bn rows x 64 bytes, two e2m1 codes a byte) -> e4m3 in the
128B-swizzled B buffer the wgmma reads. A `prmt` table lookup per 4 codes on the 3-bit magnitude, the sign bit
copied; the table pair is chosen per 32-wide sub-block by its load-time shift byte, the pair's byte offset in the
table (kernels/moe/expert_weights.py; `pair_offset`, `table_pair`).
v2 (`widen8`, `_widen_stage`; v3 overrides it): 8 codes per 32-bit word in 9 integer ops, 16-byte loads and
stores (v1's 4 codes per 16 bits: `git show 85e3cb5:kernels/moe/grouped_widen.py`). The bit-level forms have torch twins in
tests/moe/grouped_model.py, checked on every input pattern by tests/moe/test_grouped_cpu.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.gemm.tiling import KBLOCK

SUBS = KBLOCK // 32  # MXFP4 sub-blocks per K block


@dsl_user_op
def prmt(a, b, sel, *, loc=None, ip=None) -> Int32:
    """`prmt.b32`: byte k of the result is byte (nibble k of sel) of the 8-byte pair {b:a}."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(v).ir_value(loc=loc, ip=ip) for v in (a, b, sel)], "prmt.b32 $0, $1, $2, $3;",
        "=r,r,r,r", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def pair_offset(word: Int32, s) -> Int32:
    """Byte s of a shift word, zero-extended: sub-block s's table pair offset in bytes. One `prmt` (bytes 4-7 of
    the pool {0:word} are zero), for a constant or a run-time s."""
    return prmt(word, 0, 0x4440 + s)


def table_pair(tab, off):
    """The 8-byte table pair at byte offset `off` (`pair_offset`) of the shared table `tab` (int32), as a (2,) int32
    view: the offset is added to a byte pointer as it comes, no scaling op, and declared a multiple of 8 so that the
    pair is one 8-byte load (LDS.64)."""
    p = cute.recast_ptr(tab.iterator, dtype=Uint8) + cute.assume(off, divby=8)
    return cute.make_tensor(cute.recast_ptr(p, dtype=Int32), cute.make_layout((2,)))


SIGNS = -0x7F7F7F80  # 0x80808080: bit 7 of every byte


@cute.jit
def widen8(word: Int32, t0: Int32, t1: Int32):
    """8 e2m1 codes (a 32-bit word; code 2b in the low nibble of byte b, 2b + 1 in the high one) -> 8 e4m3
    bytes as two words (codes 0-3, codes 4-7): the magnitudes from the shift's table (`prmt` on the 3-bit
    magnitudes; the selector is the low 16 bits), the signs by two more `prmt` on (word, word << 4) that
    put code k's bit 3 at bit 7 of output byte k: even codes from word << 4, odd ones from word itself;
    OR-ed in under the 0x80 mask (one LOP3). 9 integer ops for 8 codes (v1's widen4: ~20)."""
    mag = word & 0x77777777
    sgn = word << 4
    lo = prmt(t0, t1, mag) | (prmt(word, sgn, 0x1504) & SIGNS)
    hi = prmt(t0, t1, mag >> 16) | (prmt(word, sgn, 0x3726) & SIGNS)  # mag >= 0: the shift is logical
    return lo, hi


@cute.jit
def widen8_rs(word: Int32, t0: Int32, t1: Int32):
    """`widen8` of a word in the RS tiles' sign layout (kernels/moe/expert_weights.rs_sign_layout: nibble n holds code
    n's magnitude in bits 0-2 and the sign of code 4 + n / 2 (even n) or (n - 1) / 2 (odd n) in bit 3): codes 0-3's
    signs already sit at bit 7 of their output bytes, codes 4-7's four bits lower, so each half is its `prmt` on the
    magnitudes OR-ed with the word's (or the word << 4's) 0x80 bits: 7 integer ops for 8 codes."""
    mag = word & 0x77777777
    lo = prmt(t0, t1, mag) | (word & SIGNS)
    hi = prmt(t0, t1, mag >> 16) | ((word << 4) & SIGNS)
    return lo, hi


@cute.jit
def widen_item(words, tabs, step, out):
    """Item `step`'s 4 code words (32 codes) -> `out`, its 32 e4m3 bytes as two 16-byte chunks (columns 0, 1):
    `widen8` on each word with the item's table pair."""
    for wi in cutlass.range_constexpr(4):
        lo, hi = widen8(words[wi, step], tabs[0, step], tabs[1, step])
        out[(wi % 2) * 2, wi // 2] = lo
        out[(wi % 2) * 2 + 1, wi // 2] = hi


@cute.jit
def widen_item_rs(words, tabs, step, out):
    """`widen_item` of an item read from the RS tiles (kernels/moe/expert_weights.rs_tiles): word q holds the
    sub-block's codes 4q .. 4q + 3 and 16 + 4q .. + 3, so its two widened words (`widen8_rs`) are word q of chunk 0
    and of chunk 1."""
    for q in cutlass.range_constexpr(4):
        lo, hi = widen8_rs(words[q, step], tabs[0, step], tabs[1, step])
        out[q, 0] = lo
        out[q, 1] = hi


class GroupedWidening:
    @cute.jit
    def _widen_stage(self, st, sSh, tab, stage, buf, ctid):
        """The stage's FP4 tile -> e4m3 in the 128B-swizzled B buffer `buf`, by both consumer warpgroups: every load
        of the thread's items first (a 16-byte vector of codes, the shift word, the 8-byte table pair: loads issued
        together, none waiting behind a store), then per item 4 `widen8` and two 16-byte stores (the two swizzled chunks; a quarter-warp's 8 stores cover the
        32 banks: rows n, n + 1 take the even / odd chunks)."""
        c = self.cfg
        steps = c.bn * SUBS // (128 * c.n_mma_wg)
        q4, b4, words, tabs, out = self._widen_views(st, steps)
        for step in cutlass.range_constexpr(steps):
            item = step * 128 * c.n_mma_wg + ctid
            n = item // SUBS
            cute.autovec_copy(q4[None, stage * (c.bn * 4) + item], words[None, step])
            cute.autovec_copy(table_pair(tab, pair_offset(sSh[n, 0, stage], item % SUBS)), tabs[None, step])
        for step in cutlass.range_constexpr(steps):
            item = step * 128 * c.n_mma_wg + ctid
            n = item // SUBS
            j = item % SUBS
            widen_item(words, tabs, step, out)
            for h in cutlass.range_constexpr(2):
                cute.autovec_copy(out[None, h], b4[None, buf * (c.bn * 8) + n * 8 + ((2 * j + h) ^ (n % 8))])

    @cute.jit
    def _widen_views(self, st, steps):
        """The v2 widening's operands (v3's too): 16-byte word vectors of the stages' FP4 tiles (q4) and of the
        widened B buffers (b4), and the thread's registers for `steps` items: their code words and table pairs
        (loaded first), one item's output (`widen_item`)."""
        c = self.cfg
        q4 = cute.make_tensor(cute.recast_ptr(st.sQ.data_ptr(), dtype=Int32),
                              cute.make_layout((4, c.n_stages * c.bn * 4), stride=(1, 4)))
        b4 = cute.make_tensor(cute.recast_ptr(st.sB.data_ptr(), dtype=Int32),
                              cute.make_layout((4, c.widen_buffers * c.bn * 8), stride=(1, 4)))
        words = cute.make_rmem_tensor(cute.make_layout((4, steps), stride=(1, 4)), Int32)
        tabs = cute.make_rmem_tensor(cute.make_layout((2, steps), stride=(1, 2)), Int32)
        out = cute.make_rmem_tensor(cute.make_layout((4, 2), stride=(1, 4)), Int32)
        return q4, b4, words, tabs, out
