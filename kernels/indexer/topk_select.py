"""The building blocks of the indexer top-k kernels (kernels/indexer/topk_sm90.py): the order key,
block scans, the radix select and the index-order gather over a source
of keys (the row in global memory, or a buffer of (key, index) pairs), the sampled lower bound and the
collect pass that fills a buffer. Every block is CTA-wide (THREADS threads) and ends on a barrier
where its shared memory may be reused."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernels.bits import f32_bits

THREADS = 512
WARP = 32
WARPS = THREADS // WARP
DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, width) of the radix digits, most significant first
BINS = 1 << max(w for _, w in DIGITS)
SIGN = -(1 << 31)  # 0x80000000 as a signed int32
NEG_INF_KEY = -0x7F800000  # order key of -inf (signed int32)
LOWEST_VALID = NEG_INF_KEY + 1  # key_lo that takes every valid entry
PACK = 16  # gather scan: "equal" counts live in bits 16.., "above" counts in bits 0..15 (a step <= THREADS)
VEC = 4  # fp32 per vector load
PER_THREAD = 16  # consecutive entries a thread collects per step (default)
CAP = 8192  # the candidate buffer, (key, index) pairs
SAMPLE = 4096  # sampled entries of a long row (held in the key buffer)
SLACK = 16  # sample rank margin
CHUNK_BITS = 10
MAX_CHUNKS = 1 << CHUNK_BITS  # chunks a row of the split form's finish (their offsets live in shared memory)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def order_key(x: Float32) -> Int32:
    """A signed int32 with the order of the fp32 x: its bits if the sign bit is clear, minus its
    magnitude bits if set, so -0.0 and +0.0 share the key 0 (equal, as for the oracle's sort), -inf is
    NEG_INF_KEY and a -NaN sits below it. No overflow: keys lie in [-(2^31 - 1), 2^31 - 1]."""
    b = f32_bits(x)
    return cutlass.select_(b < Int32(0), Int32(0) - (b & Int32(0x7FFFFFFF)), b)


def sample_rank(kk, n, samples: int = SAMPLE):
    """The rank r (1-based, <= samples) of the sampled key used as the lower bound: about 2 KK entries
    of an n-entry row (n > CAP) are expected at or above the r-th largest of `samples` evenly spaced
    ones. With KK = 1024 of 262,144 and SAMPLE samples, the sample holds 16 +- 4 entries above the true
    threshold and r = 48; the buffer then receives ~3,000 of its 8,192 slots (2,048 samples: r = 32,
    ~4,100 +- 18%). Works on ints (host model) and Int32 (kernel)."""
    r = (2 * kk * samples + n - 1) // n + SLACK
    return cutlass.min(r, samples) if isinstance(r, Int32) else min(r, samples)


def fast_path_possible(kk):
    """A sampled bound aims at ~2 KK candidates: the buffer must hold twice that (ints on the host, the
    runtime KK in the kernel)."""
    return 4 * kk <= CAP


def warp_inclusive_scan(v, lane):
    """Inclusive prefix sum over the warp's lanes (Int32)."""
    for o in range(5):
        up = cute.arch.shuffle_sync_up(v, offset=1 << o)
        v = v + cutlass.select_(lane >= (1 << o), up, Int32(0))
    return v




class TopkBlocks:
    """Mixin of the kernels. `per_thread`: entries a thread collects per step (a multiple of VEC)."""

    def __init__(self, per_thread: int = PER_THREAD):
        assert per_thread % VEC == 0
        self.per_thread, self.step = per_thread, THREADS * per_thread

    # ---------------- block-wide scans ----------------

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

    # ---------------- sources of keys: the row in global memory, or the shared buffer ----------------

    @cute.jit
    def key_at(self, mX: cute.Tensor, row, sKey: cute.Tensor, i, from_row: cutlass.Constexpr):
        if cutlass.const_expr(from_row):
            return order_key(mX[row, i])
        return sKey[i]

    @cute.jit
    def index_at(self, sIdx: cute.Tensor, i, from_row: cutlass.Constexpr):
        if cutlass.const_expr(from_row):
            return i
        return sIdx[i]

    # ---------------- radix select and gather ----------------

    @cute.jit
    def radix_select(self, mX, row, sKey, n, kk, from_row: cutlass.Constexpr, sHist, sW, sState, tidx):
        """The KK-th largest valid key of the source's n entries: (threshold key, how many entries equal
        to it are taken, how many are selected). Fewer than KK valid: (key(-inf), 0, valid count)."""
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
                    key = self.key_at(mX, row, sKey, i, from_row)
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
        need = remaining
        if take_all != 0:
            thr = Int32(NEG_INF_KEY)
            need = Int32(0)
        return thr, need, n_sel

    @cute.jit
    def gather(self, mX, row, sKey, sIdx, n, thr, need, n_sel, from_row: cutlass.Constexpr, mOut, sW, tidx):
        """Write the selected entries' indices (key > thr, and the first `need` equal to it) to the
        output row in ascending index order."""
        above_seen = Int32(0)
        equal_seen = Int32(0)
        lt = Int32(cute.arch.lanemask_lt())
        for base in cutlass.range(0, n, THREADS):
            if (above_seen + cutlass.min(equal_seen, need)) < n_sel:  # CTA-uniform
                i = base + tidx
                key = Int32(NEG_INF_KEY)
                if i < n:
                    key = self.key_at(mX, row, sKey, i, from_row)
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
                    mOut[row, a_before + cutlass.min(e_before, need)] = self.index_at(sIdx, i, from_row)
                if equal & (e_before < need):
                    mOut[row, a_before + e_before] = self.index_at(sIdx, i, from_row)
                above_seen += w_total & Int32((1 << PACK) - 1)
                equal_seen += w_total >> PACK

    # ---------------- the fast path's two steps ----------------

    @cute.jit
    def lower_bound(self, mX, row, n, kk, sKey, sHist, sW, sState, tidx, stride, samples: int = SAMPLE):
        """key_lo for an n-entry row: the r-th largest (`sample_rank`) of the `samples` entries of mX's
        row at `stride` (LOWEST_VALID when fewer than r of them are valid)."""
        for j in cutlass.range_constexpr(samples // THREADS):
            s = j * THREADS + tidx
            sKey[s] = order_key(mX[row, s * stride])
        cute.arch.barrier()
        thr, _, _ = self.radix_select(mX, row, sKey, samples, sample_rank(kk, n, samples), False, sHist, sW, sState,
                                      tidx)
        return cutlass.select_(thr == Int32(NEG_INF_KEY), Int32(LOWEST_VALID), thr)

    @cute.jit
    def load_entries(self, mX, tiles, row, end, first, vals):
        """vals <- the row's per_thread entries from `first` (16-byte vectors when the compile's alignment
        allows; -inf from `end` on)."""
        if first + self.per_thread <= end:
            for v in cutlass.range_constexpr(self.per_thread // VEC):
                cute.autovec_copy(tiles[(0, None), (row, first // VEC + v)], cute.local_tile(vals, (VEC,), (v,)))
        else:
            for e in cutlass.range_constexpr(self.per_thread):
                vals[e] = Float32(float("-inf"))
                if first + e < end:
                    vals[e] = mX[row, first + e]

    @cute.jit
    def collect(self, mX, row, start, end, key_lo, dKey, dIdx, sW, tidx):
        """Append the row's entries [start, end) with key >= key_lo to the buffer (dKey, dIdx: 1-D, shared
        or global) in index order; start a multiple of VEC. Returns how many there are, or more than CAP
        if the buffer overflowed (the pass then stops). The next step's loads are issued before this
        step's scan, so a CTA keeps two steps of loads in flight."""
        count = Int32(0)
        pt = self.per_thread
        vals = cute.make_rmem_tensor((pt,), Float32)
        ahead = cute.make_rmem_tensor((pt,), Float32)
        tiles = cute.zipped_divide(mX, (1, VEC))
        self.load_entries(mX, tiles, row, end, start + tidx * pt, ahead)
        for base in cutlass.range(start, end, self.step):
            if count <= CAP:  # CTA-uniform
                first = base + tidx * pt
                for e in cutlass.range_constexpr(pt):
                    vals[e] = ahead[e]
                if base + self.step < end:
                    self.load_entries(mX, tiles, row, end, first + self.step, ahead)
                mine = Int32(0)
                for e in cutlass.range_constexpr(pt):
                    if order_key(vals[e]) >= key_lo:
                        mine += 1
                pos, total = self.block_scan(mine, sW, tidx)
                pos += count
                if count + total <= CAP:
                    for e in cutlass.range_constexpr(pt):
                        key = order_key(vals[e])
                        if key >= key_lo:
                            dKey[pos] = key
                            dIdx[pos] = first + e
                            pos += 1
                count += total
        return count
