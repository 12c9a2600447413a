"""Temperature + Gumbel-max sampler in CuTeDSL (spec §9.3): one token per row of logits [B, V].

Semantics (oracles.head.sample): T = 0 → argmax(logits); otherwise argmax(softmax(l / max(T, 1e-5)) / n)
with n ~ Exponential(1). The noise n is an input (the family draws it from the seeded generator the
oracle uses), so kernel and oracle see the same noise. Softmax is monotone and its max and sum are
common to a row, so the kernel ranks candidates by log(p/n) = x − g (x = l/T, g = log n; g = 0 when
T = 0) without computing either: one pass, no max, no sum. Two candidates are compared through
d = (x_a − x_b) − (g_a − g_b), not through x − g itself, whose rounding at |x| ~ 1e5 (small T)
would swamp the noise; x_a − x_b is exact for near-equal x (Sterbenz). d = 0 → the lower index wins,
as torch.argmax.

Two launches, no atomics: (1) grid (splits, B): each CTA scans a contiguous run of 1024-wide tiles
of its row with 128-bit loads and writes its best (key, index); (2) one warp per row reduces the
`splits` partials and writes the token (int64). Per-row temperatures; a T = 0 row never reads noise.
One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
from cutlass import Float32, Int32, Int64

VEC = 4  # fp32 per 16-byte vector
THREADS = 256
TILE = VEC * THREADS
MAX_SPLITS = 64
WARP = 32
MIN_TEMPERATURE = 1e-5
NO_INDEX = 2**31 - 1


def better(x, g, i, bx, bg, bi):
    """Candidate (x, g, i) beats the best (bx, bg, bi): larger x − g, or equal and a lower index."""
    d = (x - bx) - (g - bg)
    return (d > 0.0) | ((d == 0.0) & (i < bi))


def warp_argmax(x, g, i):
    """Butterfly arg-max over the warp (traced inline: a plain Python loop unrolls)."""
    for o in range(5):
        ox = cute.arch.shuffle_sync_bfly(x, offset=1 << o)
        og = cute.arch.shuffle_sync_bfly(g, offset=1 << o)
        oi = cute.arch.shuffle_sync_bfly(i, offset=1 << o)
        take = better(ox, og, oi, x, g, i)
        x, g, i = cutlass.select_(take, ox, x), cutlass.select_(take, og, g), cutlass.select_(take, oi, i)
    return x, g, i


EMPTY = (float("-inf"), 0.0, NO_INDEX)  # (x, g, index) of "no candidate yet"


class SamplerKernel:
    """Compile-time: vocabulary size V. Runtime: rows B, per-row temperatures."""

    def __init__(self, vocab: int):
        if vocab <= 0 or vocab % VEC:
            raise ValueError(f"vocabulary {vocab} must be a positive multiple of {VEC}")
        self.vocab = vocab
        tiles = -(-vocab // TILE)
        self.tiles_per_split = -(-tiles // MAX_SPLITS)
        self.splits = -(-tiles // self.tiles_per_split)  # every split has at least one tile

    @cute.jit
    def __call__(self, mL: cute.Tensor, mT: cute.Tensor, mN: cute.Tensor, mPF: cute.Tensor, mPI: cute.Tensor,
                 mTok: cute.Tensor, stream):
        rows = mL.shape[0]
        self.partial(mL, mT, mN, mPF, mPI).launch(grid=[self.splits, rows, 1], block=[THREADS, 1, 1], stream=stream)
        self.finish(mPF, mPI, mTok).launch(grid=[rows, 1, 1], block=[WARP, 1, 1], stream=stream)

    @cute.kernel
    def partial(self, mL: cute.Tensor, mT: cute.Tensor, mN: cute.Tensor, mPF: cute.Tensor, mPI: cute.Tensor):
        """Best (x, g, index) of tiles [split·tps, (split+1)·tps) of `row` → mPF[row, :, split], mPI[row, split]."""
        tidx, _, _ = cute.arch.thread_idx()
        split, row, _ = cute.arch.block_idx()
        temperature = Float32(mT[row])
        greedy = temperature == 0.0
        t_eff = cute.arch.fmax(temperature, Float32(MIN_TEMPERATURE))

        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=VEC * 32)
        thr = cute.make_tiled_copy(atom, cute.make_layout((THREADS, VEC), stride=(VEC, 1)), (1, TILE)).get_slice(tidx)
        ident = cute.make_identity_tensor(mL.shape)

        # Issue every load of this split first (logits, and noise unless the row is greedy), then rank.
        cols, logits, noises = [], [], []
        for k in cutlass.range_constexpr(self.tiles_per_split):
            tile = split * self.tiles_per_split + k
            col0 = thr.partition_S(cute.local_tile(ident, (1, TILE), (row, tile)))[0][1]
            tLg = thr.partition_S(cute.local_tile(mL, (1, TILE), (row, tile)))
            tNg = thr.partition_S(cute.local_tile(mN, (1, TILE), (row, tile)))
            logit, noise = cute.make_fragment_like(tLg), cute.make_fragment_like(tNg)
            noise.fill(1.0)
            if col0 < self.vocab:  # V % 4 == 0: a thread's vector is wholly in or out
                cute.copy(atom, tLg, logit)
                if not greedy:
                    cute.copy(atom, tNg, noise)
            cols.append(col0)
            logits.append(logit)
            noises.append(noise)

        bx, bg, bi = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
        for k in cutlass.range_constexpr(self.tiles_per_split):
            if cols[k] < self.vocab:
                for e in cutlass.range_constexpr(VEC):
                    x, g = logits[k][e], Float32(0.0)
                    if not greedy:
                        x, g = x / t_eff, cute.math.log(noises[k][e])
                    take = better(x, g, cols[k] + e, bx, bg, bi)
                    bx, bg = cutlass.select_(take, x, bx), cutlass.select_(take, g, bg)
                    bi = cutlass.select_(take, cols[k] + e, bi)

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
            x, g, i = warp_argmax(x, g, i)
            if lane == 0:
                mPF[row, 0, split], mPF[row, 1, split], mPI[row, split] = x, g, i

    @cute.kernel
    def finish(self, mPF: cute.Tensor, mPI: cute.Tensor, mTok: cute.Tensor):
        """One warp per row: the best of the row's `splits` partials → mTok[row] (int64)."""
        lane, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        x, g, i = Float32(EMPTY[0]), Float32(EMPTY[1]), Int32(EMPTY[2])
        for s in cutlass.range_constexpr(0, self.splits, WARP):
            if lane + s < self.splits:
                px, pg, pi = Float32(mPF[row, 0, lane + s]), Float32(mPF[row, 1, lane + s]), Int32(mPI[row, lane + s])
                take = better(px, pg, pi, x, g, i)
                x, g, i = cutlass.select_(take, px, x), cutlass.select_(take, pg, g), cutlass.select_(take, pi, i)
        x, g, i = warp_argmax(x, g, i)
        if lane == 0:
            mTok[row] = Int64(i)
