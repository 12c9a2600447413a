"""A v12 candidate of the sparse prefill (issue #25): v11 (the default) with a token's head blocks
adjacent in launch order, `cutedsl:head-adjacent`.

v11 launches (query token, head block, batch) with the token fastest, so Pro's two 64-head blocks of a
token run half a kernel apart. FlashMLA's SM90 sparse prefill orders its blocks the other way
(blockIdx.x = token x head blocks + head block): the two CTAs that gather the same 1152 rows run side by
side. The H100 top-k sweep shows the difference where it would: at h_q 64 (one head block) v11 and
FlashMLA cost the same per 64-key tile, at h_q 128 v11 costs 7.6% more per tile, and FlashMLA's h_q 128
CTA is faster than its own h_q 64 one (docs/perf/fmha.md, "v11"). Here the grid is (tokens x head
blocks, 1, batch) and a CTA decodes its token and head block from x; elsewhere (one head block, or
persistent) v11's code.
"""

from __future__ import annotations

import cutlass.cute as cute

from kernels.fmha.prefill_v11 import V11


class HeadAdjacent(V11):
    def _adjacent(self) -> bool:
        """Where the order changes: v11's shapes with more than one head block a kv head, one item a CTA."""
        c = self.cfg
        return self._v11_applies() and c.n_hblk > 1 and not c.persistent

    def _launch_grid(self, n_rows, n_hblk_all, batch) -> tuple:
        if not self._adjacent():
            return super()._launch_grid(n_rows, n_hblk_all, batch)
        return n_rows * n_hblk_all, 1, batch

    def _block_coords(self, n_hblk_all):
        if not self._adjacent():
            return super()._block_coords(n_hblk_all)
        x, _, bidx = cute.arch.block_idx()
        return x // n_hblk_all, x % n_hblk_all, bidx
