"""Temperature + Gumbel-max sampler in CuTeDSL (spec §9.3): one token per row of logits [B, V].

Semantics (oracles.head.sample): T = 0 → argmax(logits); otherwise argmax(softmax(l / max(T, 1e-5)) / n)
with n ~ Exponential(1). The noise n is an input (the family draws it from the seeded generator the
oracle uses), so kernel and oracle see the same noise. Softmax is monotone and its max and sum are
common to a row, so the kernel ranks candidates by log(p/n) = x − g (x = l/T, g = log n; g = 0 when
T = 0) without computing either: one pass, no max, no sum. Two candidates are compared through
d = (x_a − x_b) − (g_a − g_b), not through x − g itself, whose rounding at |x| ~ 1e5 (small T)
would swamp the noise; x_a − x_b is exact for near-equal x (Sterbenz). d = 0 → the lower index wins,
as torch.argmax.

v3, one launch: grid (splits, B) with splits chosen at run time from B (`plan`) so that the grid is
about TARGET_CTAS CTAs — all resident at once (two per SM), each streaming a contiguous run of
1024-wide tiles of its row with 128-bit loads, DEPTH tiles per batch, two batches in flight (the
next batch's loads are issued before the current one is ranked). A CTA's best (x, g, index) goes to
the row's workspace slot; the last CTA of the row to arrive (an int32 arrival counter per row: one
acq_rel atomic add) merges the row's partials in split order, writes the
token (int64) and puts the counter back to 0, so every call starts from zero. With one split per
row (B ≥ TARGET_CTAS) the CTA writes the token itself and the counter is not touched. Per-row
temperatures; a T = 0 row reads no noise, except the one batch of a CTA whose run is that short
(its noise is issued before the temperature is known). One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import torch
from cutlass import Float32, Int32, Int64

VEC = 4  # fp32 per 16-byte vector
THREADS = 256
TILE = VEC * THREADS
DEPTH = 4  # tiles per batch: DEPTH 16-byte loads per stream per thread, two batches in flight
TARGET_CTAS = 264  # 2 resident CTAs on each of the H100's 132 SMs (B200: 148 SMs, still one wave)
WARP = 32
MIN_TEMPERATURE = 1e-5
NO_INDEX = 2**31 - 1

_COUNTERS: dict = {}


def counters(rows: int, device) -> torch.Tensor:
    """A zeroed int32 arrival counter per row on `device`, kept across calls: every launch leaves
    the counters it used at zero again (the merging CTA resets its row's)."""
    buf = _COUNTERS.get(str(device))
    if buf is None or buf.numel() < rows:
        buf = torch.zeros(max(rows, 1 << 10), dtype=torch.int32, device=device)
        _COUNTERS[str(device)] = buf
    return buf


def plan(rows, tiles):
    """(tiles per split, splits) for `rows` rows of `tiles` tiles: about TARGET_CTAS CTAs, every split
    non-empty. Python ints (tests, docs) or the launch's dynamic Int32 (SamplerKernel.__call__)."""
    want = cutlass.max(1, cutlass.min(tiles, TARGET_CTAS // rows))
    per_split = (tiles + want - 1) // want
    return per_split, (tiles + per_split - 1) // per_split


def better(x, g, i, bx, bg, bi):
    """Candidate (x, g, i) beats the best (bx, bg, bi): larger x − g, or equal and a lower index."""
    d = (x - bx) - (g - bg)
    return (d > 0.0) | ((d == 0.0) & (i < bi))


def take_better(x, g, i, bx, bg, bi, valid=True):
    """The better of candidate (x, g, i) (ignored unless `valid`) and the best (bx, bg, bi)."""
    take = better(x, g, i, bx, bg, bi) & valid
    return cutlass.select_(take, x, bx), cutlass.select_(take, g, bg), cutlass.select_(take, i, bi)


def warp_argmax(x, g, i):
    """Butterfly arg-max over the warp (traced inline: a plain Python loop unrolls)."""
    for o in range(5):
        ox = cute.arch.shuffle_sync_bfly(x, offset=1 << o)
        og = cute.arch.shuffle_sync_bfly(g, offset=1 << o)
        oi = cute.arch.shuffle_sync_bfly(i, offset=1 << o)
        x, g, i = take_better(ox, og, oi, x, g, i)
    return x, g, i


EMPTY = (float("-inf"), 0.0, NO_INDEX)  # (x, g, index) of "no candidate yet"


class SamplerKernel:
    """Compile-time: vocabulary size V. Runtime: rows B (→ splits, see `plan`), per-row temperatures.

    Arguments: logits [B, V], temperatures [B], noise [B, V] (fp32); workspace partial keys
    [B, 2, tiles] fp32 and indices [B, tiles] int32 (fresh each call); counters [≥ B] int32 (zero
    before the call, zero after it); tokens [B] int64."""

    def __init__(self, vocab: int):
        if vocab <= 0 or vocab % VEC:
            raise ValueError(f"vocabulary {vocab} must be a positive multiple of {VEC}")
        self.vocab = vocab
        self.tiles = -(-vocab // TILE)  # also the most splits a row can have (the workspace width)

    @cute.jit
    def __call__(self, mL: cute.Tensor, mT: cute.Tensor, mN: cute.Tensor, mPF: cute.Tensor, mPI: cute.Tensor,
                 mCnt: cute.Tensor, mTok: cute.Tensor, stream):
        rows = mL.shape[0]
        per_split, splits = plan(rows, self.tiles)
        self.kernel(mL, mT, mN, mPF, mPI, mCnt, mTok, per_split).launch(
            grid=[splits, rows, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.jit
    def issue(self, gX: cute.Tensor, buf: cute.Tensor, row, tile, end, tidx):
        """Load tiles tile .. tile + DEPTH − 1 (those < end) of `row` into buf[k, :] (one vector each)."""
        for k in cutlass.range_constexpr(DEPTH):
            vec = (tile + k) * THREADS + tidx
            if (tile + k < end) & (vec * VEC < self.vocab):  # V % 4 == 0: a vector is wholly in or out
                cute.autovec_copy(gX[(0, None), (row, vec)], buf[k, None])

    @cute.jit
    def rank(self, logit: cute.Tensor, noise: cute.Tensor, tile, end, tidx, t_eff, best, sampled: cutlass.Constexpr):
        """Fold the batch of tiles tile .. tile + DEPTH − 1 (those < end) into best = (x, g, index)."""
        bx, bg, bi = best
        for k in cutlass.range_constexpr(DEPTH):
            # a CTA-uniform branch, not a select: a tile past the run costs no divide and no log
            # (B = 1 runs one tile per CTA; ranking the 7 empty slots of its two batches had been
            # 6 of its 10.5 µs: the no-rank knock-out, kernels/sampler/variants.py, docs/perf/sampler.md v5)
            if tile + k < end:
                col = ((tile + k) * THREADS + tidx) * VEC
                for e in cutlass.range_constexpr(VEC):
                    x, g = logit[k, e], Float32(0.0)
                    if cutlass.const_expr(sampled):
                        x, g = x / t_eff, cute.math.log(noise[k, e])
                    bx, bg, bi = take_better(x, g, col + e, bx, bg, bi, col < self.vocab)
        return bx, bg, bi

    @cute.jit
    def stream(self, gL, gN, logit0, noise0, row, first, end, tidx, t_eff, noise0_issued,
               sampled: cutlass.Constexpr):
        """Best (x, g, index) of tiles [first, end) of `row`; batch 0's logits are already issued into
        logit0 (and its noise into noise0 when `noise0_issued`). Two batches in flight: batch j + 1 is
        issued before batch j is ranked."""
        logit1 = cute.make_rmem_tensor(cute.make_layout((DEPTH, VEC), stride=(VEC, 1)), Float32)
        noise1 = cute.make_rmem_tensor(cute.make_layout((DEPTH, VEC), stride=(VEC, 1)), Float32)
        if cutlass.const_expr(sampled):
            if not noise0_issued:
                self.issue(gN, noise0, row, first, end, tidx)
        best = (Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2]))
        for t in cutlass.range(first, end, 2 * DEPTH):
            self.issue(gL, logit1, row, t + DEPTH, end, tidx)
            if cutlass.const_expr(sampled):
                self.issue(gN, noise1, row, t + DEPTH, end, tidx)
            best = self.rank(logit0, noise0, t, end, tidx, t_eff, best, sampled)
            self.issue(gL, logit0, row, t + 2 * DEPTH, end, tidx)
            if cutlass.const_expr(sampled):
                self.issue(gN, noise0, row, t + 2 * DEPTH, end, tidx)
            best = self.rank(logit1, noise1, t + DEPTH, end, tidx, t_eff, best, sampled)
        return best

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mT: cute.Tensor, mN: cute.Tensor, mPF: cute.Tensor, mPI: cute.Tensor,
               mCnt: cute.Tensor, mTok: cute.Tensor, per_split: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        split, row, _ = cute.arch.block_idx()
        splits, _, _ = cute.arch.grid_dim()
        first = split * per_split
        end = cutlass.min(first + per_split, Int32(self.tiles))
        gL = cute.zipped_divide(mL, (1, VEC))  # ((1, 4), (B, V/4))
        gN = cute.zipped_divide(mN, (1, VEC))

        # The first batch of logits goes out before the temperature is needed. Its noise goes out
        # with it, before the temperature says whether the row samples, when the CTA's run is that one
        # batch (few rows, many splits: a CTA is then a chain of dependent memory trips, and waiting
        # for the temperature was one of them); a greedy row then reads up to 16 KB of noise per CTA
        # that it ignores. Longer runs issue the noise after the temperature.
        temperature = Float32(mT[row])
        logit0 = cute.make_rmem_tensor(cute.make_layout((DEPTH, VEC), stride=(VEC, 1)), Float32)
        noise0 = cute.make_rmem_tensor(cute.make_layout((DEPTH, VEC), stride=(VEC, 1)), Float32)
        self.issue(gL, logit0, row, first, end, tidx)
        one_batch = end - first <= DEPTH
        if one_batch:
            self.issue(gN, noise0, row, first, end, tidx)
        t_eff = cute.arch.fmax(temperature, Float32(MIN_TEMPERATURE))
        bx, bg, bi = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
        if temperature == 0.0:
            bx, bg, bi = self.stream(gL, gN, logit0, noise0, row, first, end, tidx, t_eff, one_batch, False)
        else:
            bx, bg, bi = self.stream(gL, gN, logit0, noise0, row, first, end, tidx, t_eff, one_batch, True)

        bx, bg, bi = warp_argmax(bx, bg, bi)
        smem = utils.SmemAllocator()
        warps = THREADS // WARP
        sF = smem.allocate_tensor(Float32, cute.make_layout((2, warps)), byte_alignment=4)
        sI = smem.allocate_tensor(Int32, cute.make_layout((warps,)), byte_alignment=4)
        warp, lane = tidx // WARP, tidx % WARP
        if lane == 0:
            sF[0, warp], sF[1, warp], sI[warp] = bx, bg, bi
        cute.arch.barrier()
        if warp == 0:
            x, g, i = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
            if lane < warps:
                x, g, i = sF[0, lane], sF[1, lane], sI[lane]
            x, g, i = warp_argmax(x, g, i)  # every lane holds the CTA's best
            if splits == 1:
                if lane == 0:
                    mTok[row] = Int64(i)
            else:
                self.merge(mPF, mPI, mCnt, mTok, row, split, splits, lane, x, g, i)

    @cute.jit
    def merge(self, mPF: cute.Tensor, mPI: cute.Tensor, mCnt: cute.Tensor, mTok: cute.Tensor, row, split, splits,
              lane, x, g, i):
        """Warp 0: publish this split's best; the row's last CTA to arrive merges all `splits` partials
        in split order (lane l folds splits l, l + 32, …, then the butterfly), writes the token and
        resets the row's counter."""
        arrived = Int32(0)
        if lane == 0:  # release: this partial is visible before the arrival counts; acquire: so are
            # the partials of every CTA that arrived before (one atomic, no separate fences)
            mPF[row, 0, split], mPF[row, 1, split], mPI[row, split] = x, g, i
            arrived = cute.arch.atomic_add(mCnt.iterator + row, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.sync_warp()  # orders lane 0's acquire before the other lanes' loads below
        arrived = cute.arch.shuffle_sync(arrived, 0)
        if arrived == splits - 1:  # the row's last CTA
            if lane == 0:
                mCnt[row] = Int32(0)  # the next call starts from zero
            x, g, i = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
            for k in cutlass.range_constexpr(-(-self.tiles // WARP)):  # unrolled: all loads in flight at once
                s = lane + k * WARP
                px, pg, pi = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
                if s < splits:  # L2 loads: no stale L1 line can be read
                    px = cute.arch.load(mPF.iterator + cute.crd2idx((row, 0, s), mPF.layout), Float32,
                                        sem="relaxed", scope="gpu")
                    pg = cute.arch.load(mPF.iterator + cute.crd2idx((row, 1, s), mPF.layout), Float32,
                                        sem="relaxed", scope="gpu")
                    pi = cute.arch.load(mPI.iterator + cute.crd2idx((row, s), mPI.layout), Int32, sem="relaxed",
                                        scope="gpu")
                x, g, i = take_better(px, pg, pi, x, g, i)
            x, g, i = warp_argmax(x, g, i)
            if lane == 0:
                mTok[row] = Int64(i)
