"""The online softmax: the mask of a tile (key validity and position), the row max, exp2, the row
sums and O's rescale factor. Knock-out seams (variants.py): `_mask_tile` and `_softmax_scores`
(with the key split's per-row step, key_split.py `_softmax_tile`) are the softmax; `_exp2` is
the MUFU's share of it."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def any_moved(corr: cute.Tensor) -> cutlass.Boolean:
    """Whether some row of this warp has a rescale factor != 1. Exactly 1 when the row max did not
    move, the common case after the first tiles: skipping O *= 1 (and P's recomputation) is exact."""
    moved = corr[0] != 1.0
    for r in cutlass.range_constexpr(1, cute.size(corr)):
        moved = moved | (corr[r] != 1.0)
    return cute.arch.vote_any_sync(moved)


@cute.jit
def scale_rows(X_mn: cute.Tensor, factor: cute.Tensor):
    """Row r of X (this thread's (rows, cols) view) times factor[r]."""
    for r in cutlass.range_constexpr(cute.size(X_mn, mode=[0])):
        for cc in cutlass.range(cute.size(X_mn, mode=[1]), unroll_full=True):
            X_mn[r, cc] = X_mn[r, cc] * factor[r]


@cute.jit
def quad_row_max(S_mn: cute.Tensor, r: cutlass.Constexpr) -> cutlass.Float32:
    """Max of row r of S over the quad of threads sharing it; 4 independent chains, so a max of
    64 is not 64 deep."""
    part = [S_mn[r, q] for q in range(4)]
    for cc in cutlass.range_constexpr(4, cute.size(S_mn, mode=[1])):
        part[cc % 4] = cute.arch.fmax(part[cc % 4], S_mn[r, cc])
    return quad_allreduce(cute.arch.fmax(cute.arch.fmax(part[0], part[1]), cute.arch.fmax(part[2], part[3])),
                          cute.arch.fmax)


def quad_allreduce(x: cutlass.Float32, op) -> cutlass.Float32:
    """Reduce over the 4 threads of a quad that share an accumulator row."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return op(x, cute.arch.shuffle_sync_bfly(x, offset=2))


class Softmax:
    """Mixin of `GatherAttentionSm90` (kernel_sm90.py); `self.cfg` is its Config."""

    @cute.jit
    def _softmax_scores(self, S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window,
                        corr, stage):
        """S -> exp2(S * scale - m) in place (fp32) with m the new running row max (log2 domain);
        this thread's row sums updated; corr[r] = the factor O must be scaled by, which the caller
        applies once the previous PV has left O. The mask runs only on tiles the producer flagged."""
        n_r, n_c = cute.size(S_mn, mode=[0]), cute.size(S_mn, mode=[1])
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window)
        for r in cutlass.range_constexpr(n_r):
            m_new = cute.arch.fmax(row_max[r], quad_row_max(S_mn, r) * scale_log2)
            m_base = m_new
            if m_new == -cutlass.Float32.inf:  # a fully masked row so far: keep exp2 away from NaN
                m_base = cutlass.Float32(0.0)
            corr[r] = cute.arch.exp2(row_max[r] - m_base)
            row_max[r] = m_new
            sums = [cutlass.Float32(0.0)] * 4
            for cc in cutlass.range_constexpr(n_c):
                p = self._exp2(S_mn[r, cc] * scale_log2 - m_base, cc)
                S_mn[r, cc] = p
                sums[cc % 4] = sums[cc % 4] + p
            row_sum[r] = row_sum[r] * corr[r] + ((sums[0] + sums[1]) + (sums[2] + sums[3]))

    @cute.jit
    def _exp2(self, x, cc: cutlass.Constexpr):
        """exp2 of a score in column cc of this thread's tile (the MUFU's)."""
        return cute.arch.exp2(x)

    @cute.jit
    def _rescale_o_cast_p(self, O_mn, corr, acc_S, rP):
        if any_moved(corr):
            scale_rows(O_mn, corr)
        rP.store(acc_S.load().to(rP.element_type))

    @cute.jit
    def _key_ok(self, key, t_first, t_last, causal_off, window):
        """Whether key is valid and inside the positional mask of every query token in
        [t_first, t_last] (one row: t_first == t_last)."""
        c = self.cfg
        ok = key >= 0
        if cutlass.const_expr(not c.per_token_idx):
            ok = ok & (key > t_last + causal_off - window)
            if cutlass.const_expr(c.causal):
                ok = ok & (key <= t_first + causal_off)
            else:
                ok = ok & (key < t_first + causal_off + window)
        return ok

    @cute.jit
    def _mask_tile(self, S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window):
        """S = -inf where the key is invalid (-1) or outside the positional mask of the row's query
        token; skipped (one warp-uniform branch) when every producer warp of the tile found all its
        keys inside every row's mask: a full top-k list, or a tile away from the causal diagonal."""
        flag_warps = 2 if self.cfg.key_split else 4  # producer warps per tile
        plain = sMaskFlag[0, stage]
        for w in cutlass.range_constexpr(1, flag_warps):
            plain = plain + sMaskFlag[w, stage]
        if plain < flag_warps:
            for r in cutlass.range_constexpr(cute.size(S_mn, mode=[0])):
                for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    if not self._key_ok(sIdx[cS_mn[r, cc][1], stage], row_tok[r], row_tok[r], causal_off, window):
                        S_mn[r, cc] = -cutlass.Float32.inf
