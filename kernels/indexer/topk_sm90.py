"""Indexer top-k in CuTeDSL (spec §6): for each row of fp32 scores [T, S] (the logits kernel's output,
-inf where a key is masked), the indices of the KK = min(k, S) largest valid entries, int32 [T, KK],
-1 in the slots past the row's valid count.

Semantics: those of oracles/indexer.py `indexer_topk` as a set — exact ties go to the lower index, so
the selected set equals the oracle's (stable descending sort) exactly, not just up to ties; -inf is
never selected. Order within a row: ascending entry index (not by score), then the -1 slots.
-0.0 and +0.0 are equal (one key). NaN: a +NaN ranks above +inf (as torch.sort's descending order puts
NaN first); a -NaN (sign bit set) ranks below -inf and is never selected (unlike the oracle, which
ranks every NaN first; the logits kernel produces none).

Design, one CTA of THREADS threads per row (grid (T, 1, 1)):
  key      signed int32 with the order of the float: bits, or -(bits & 0x7fffffff) for a set sign bit
           (so -0.0 == +0.0); u = key ^ 0x80000000 is the same order as an unsigned pattern, whose
           digits are the radix digits. Valid: key > key(-inf).
  select   3 radix passes over the row (digits of 11, 11 and 10 bits, high first): each builds the
           histogram of the digit among the valid entries whose higher digits equal the prefix found
           so far (shared-memory atomics), then a block suffix-scan of the histogram finds the bucket
           holding the `remaining`-th largest; after the 3 passes the prefix is the k-th largest key
           (the threshold) and `remaining` how many entries equal to it are taken. If pass 1 finds
           at most KK valid entries, every valid entry is taken (threshold -inf, no ties).
  gather   one pass over the row in index order, THREADS entries per step: ballots of "above the
           threshold" and "equal to it", a block scan of the two counts (packed in one int32), and each
           selected entry's slot = (above before it) + min(equal before it, remaining) — so the ties
           taken are the first `remaining` in index order and the output is in ascending index order.
           Steps after the last selected entry are skipped.
  fill     slots [selected, KK) get -1.
Reads: the row 4 times (3 histograms + gather; the first rows' later passes mostly hit L2).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import memory
from cutlass import Float32, Int32

from kernels.bits import f32_bits

THREADS = 512
WARP = 32
WARPS = THREADS // WARP
DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, width) of the radix digits, most significant first
BINS = 1 << max(w for _, w in DIGITS)
SIGN = -(1 << 31)  # 0x80000000 as a signed int32
NEG_INF_KEY = -0x7F800000  # order key of -inf (signed int32)
PACK = 16  # gather scan: "equal" counts live in bits 16.., "above" counts in bits 0..15 (a step <= THREADS)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def order_key(x: Float32) -> Int32:
    """A signed int32 with the order of the fp32 x: its bits if the sign bit is clear, minus its
    magnitude bits if set, so -0.0 and +0.0 share the key 0 (equal, as for the oracle's sort), -inf is
    NEG_INF_KEY and a -NaN sits below it. No overflow: keys lie in [-(2^31 - 1), 2^31 - 1]."""
    b = f32_bits(x)
    return cutlass.select_(b < Int32(0), Int32(0) - (b & Int32(0x7FFFFFFF)), b)


def warp_inclusive_scan(v, lane):
    """Inclusive prefix sum over the warp's lanes (Int32)."""
    for o in range(5):
        up = cute.arch.shuffle_sync_up(v, offset=1 << o)
        v = v + cutlass.select_(lane >= (1 << o), up, Int32(0))
    return v


class IndexerTopkSm90:
    """Runtime: rows T, row length S (any row stride), KK = the output's width (min(k, S), host-chosen).

    Arguments: scores [T, S] fp32 (unit column stride), out [T, KK] int32 (unit column stride)."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, stream):
        self.kernel(mX, mOut).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.jit
    def warps_scan(self, w, sW: cute.Tensor, tidx):
        """w: a per-warp value (the same in every lane of a warp). Returns (the sum of w over the warps
        before this one, the sum over all warps). Two barriers: the first publishes the warp values,
        the second lets sW be reused after the return."""
        warp, lane = tidx // WARP, tidx % WARP
        if lane == 0:
            sW[warp] = w
        cute.arch.barrier()
        v = Int32(0)
        if lane < WARPS:
            v = sW[lane]
        incl = warp_inclusive_scan(v, lane)
        before = cute.arch.shuffle_sync(incl - v, warp)
        total = cute.arch.shuffle_sync(incl, WARPS - 1)
        cute.arch.barrier()
        return before, total

    @cute.jit
    def block_scan(self, v, sW: cute.Tensor, tidx):
        """(exclusive prefix of v over the CTA's threads in tidx order, CTA total)."""
        incl = warp_inclusive_scan(v, tidx % WARP)
        before, total = self.warps_scan(cute.arch.shuffle_sync(incl, WARP - 1), sW, tidx)
        return before + incl - v, total

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        n = mX.shape[1]
        kk = mOut.shape[1]

        smem = memory.SmemAllocator()
        sHist = smem.allocate_tensor(Int32, cute.make_layout((BINS,)), byte_alignment=16)
        sW = smem.allocate_tensor(Int32, cute.make_layout((WARPS,)), byte_alignment=16)
        sState = smem.allocate_tensor(Int32, cute.make_layout((2,)), byte_alignment=8)

        prefix = Int32(0)  # u-space bits of the threshold found so far
        remaining = Int32(kk)  # how many of the entries matching the prefix are still to take
        take_all = Int32(0)
        n_sel = Int32(kk)
        for p in cutlass.range_constexpr(len(DIGITS)):
            shift, width = DIGITS[p]
            bins = 1 << width
            per_thread = max(1, bins // THREADS)
            hi_mask = _s32(~((1 << (shift + width)) - 1))
            if take_all == 0:  # CTA-uniform
                for b in cutlass.range_constexpr(per_thread):
                    if b * THREADS + tidx < bins:
                        sHist[b * THREADS + tidx] = Int32(0)
                cute.arch.barrier()
                for i in cutlass.range(tidx, n, THREADS):
                    key = order_key(mX[row, i])
                    u = key ^ Int32(SIGN)
                    if (key > Int32(NEG_INF_KEY)) & ((u & Int32(hi_mask)) == prefix):
                        cute.arch.atomic_add(sHist.iterator + ((u >> shift) & Int32(bins - 1)), Int32(1))
                cute.arch.barrier()
                # thread t owns bins [t * per_thread, (t + 1) * per_thread): higher threads, higher bins
                local = Int32(0)
                for j in cutlass.range_constexpr(per_thread):
                    if tidx * per_thread + j < bins:
                        local += sHist[tidx * per_thread + j]
                before, total = self.block_scan(local, sW, tidx)
                found_all = False
                if cutlass.const_expr(p == 0):
                    found_all = total <= remaining
                if found_all:
                    take_all = Int32(1)
                    n_sel = total
                else:
                    run = total - before - local  # entries in the bins above this thread's
                    for jj in cutlass.range_constexpr(per_thread):
                        j = per_thread - 1 - jj
                        b = tidx * per_thread + j
                        c = Int32(0)
                        if b < bins:
                            c = sHist[b]
                        if (run < remaining) & (run + c >= remaining):
                            sState[0] = prefix | (b << shift)
                            sState[1] = remaining - run
                        run += c
                    cute.arch.barrier()
                    prefix = sState[0]
                    remaining = sState[1]
                    cute.arch.barrier()

        thr = prefix ^ Int32(SIGN)  # the threshold's signed key
        need = remaining  # how many entries equal to it are taken
        if take_all != 0:
            thr = Int32(NEG_INF_KEY)
            need = Int32(0)

        # gather, in index order
        above_seen = Int32(0)
        equal_seen = Int32(0)
        lane = tidx % WARP
        lt = Int32(cute.arch.lanemask_lt())
        for base in cutlass.range(0, n, THREADS):
            if (above_seen + cutlass.min(equal_seen, need)) < n_sel:  # CTA-uniform
                i = base + tidx
                key = Int32(NEG_INF_KEY)
                if i < n:
                    key = order_key(mX[row, i])
                above = (key > thr) & (i < n)
                equal = (key == thr) & (i < n)
                ba = cute.arch.vote_ballot_sync(above)
                be = cute.arch.vote_ballot_sync(equal)
                a_pre = cute.arch.popc(ba & lt)
                e_pre = cute.arch.popc(be & lt)
                w = Int32(cute.arch.popc(ba)) + (Int32(cute.arch.popc(be)) << PACK)
                w_before, w_total = self.warps_scan(w, sW, tidx)
                a_before = above_seen + (w_before & Int32((1 << PACK) - 1)) + Int32(a_pre)
                e_before = equal_seen + (w_before >> PACK) + Int32(e_pre)
                if above:
                    mOut[row, a_before + cutlass.min(e_before, need)] = i
                if equal & (e_before < need):
                    mOut[row, a_before + e_before] = i
                above_seen += w_total & Int32((1 << PACK) - 1)
                equal_seen += w_total >> PACK

        for j in cutlass.range(n_sel + tidx, kk, THREADS):
            mOut[row, j] = Int32(-1)
