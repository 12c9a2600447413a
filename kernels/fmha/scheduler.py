"""Which work items (query block x head block x batch) a CTA runs: one per CTA (its block index),
or, persistent, its share of a snake order over all items."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


class TileScheduler:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _items_of_cta(self, mIdx, mK, mQ):
        """How many work items this CTA runs: one per CTA, or (persistent) its share of the snake
        order: round k hands item k * G + c to CTA c (k even) or to CTA G - 1 - c (k odd)."""
        if cutlass.const_expr(not self.cfg.persistent):
            return cutlass.Int32(1)
        n_items = cute.size(mIdx, mode=[0]) * cute.size(mK, mode=[1]) * self.cfg.n_hblk * cute.size(mQ, mode=[3])
        g, _, _ = cute.arch.grid_dim()
        cta, _, _ = cute.arch.block_idx()
        full = n_items // g
        last = full * g + cutlass.select_(full % 2 == 0, cta, g - 1 - cta)
        return full + cutlass.select_(last < n_items, cutlass.Int32(1), cutlass.Int32(0))

    @cute.jit
    def _item(self, w, mIdx, mK, mQ, mLen):
        """Work item w of this CTA: (query block, batch, kv head, first query head, list length,
        key tiles, first query token). Persistent order: a (head block, batch) pair's query blocks
        are adjacent, last block first: its K/V stay in L2 while the CTAs of a round share them,
        and a round starts with the longest causal lists."""
        c = self.cfg
        if cutlass.const_expr(c.persistent):
            n_rows = cute.size(mIdx, mode=[0])
            n_hblk_all = cute.size(mK, mode=[1]) * c.n_hblk
            g, _, _ = cute.arch.grid_dim()
            cta, _, _ = cute.arch.block_idx()
            i = w * g + cutlass.select_(w % 2 == 0, cta, g - 1 - cta)
            blk = n_rows - 1 - i % n_rows
            hblk_all = (i // n_rows) % n_hblk_all
            bidx = i // (n_rows * n_hblk_all)
        else:
            blk, hblk_all, bidx = cute.arch.block_idx()
        kvh = hblk_all // c.n_hblk
        head0 = kvh * c.hpg + (hblk_all % c.n_hblk) * c.hb  # first query head of the item
        n_idx = mLen[blk, bidx]
        n_tiles = cutlass.max((n_idx + c.n_block - 1) // c.n_block, 1)  # >= 1: an empty list is one masked tile
        return blk, bidx, kvh, head0, n_idx, n_tiles, blk * c.tq
