"""The per-tile epilogue of the indexer logits kernels (kernels/indexer/logits_sm90.py, whose class
inherits it, and the paged decode kernel through it): from a warpgroup's (64 keys) x (bq tokens x
64 heads) accumulator to one stored logit a lane.

Each thread holds 16 of a token's 64 heads for 2 key rows (the SM90 accumulator layout); the head
sum runs in the thread (ReLU x w, 2 chains) and then over the 4 lanes of a quad, transposed
(`_quad_sum`), so each lane ends with whole sums of its own row and token(s), which it scales by its
own key's scale, masks by a select and stores with one predicated st.global at a row chosen once a
query block (`_lane_plan`). No branches, no shared memory (docs/lessons/indexer.md 5: the branchy
form of this epilogue executed 1.5x DeepGEMM's instructions).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from kernels.regs import mn_view


class LogitsEpilogue:
    """Mixed into the logits kernel class (needs `self.cfg`: a LogitsConfig)."""

    @cute.jit
    def _lane_plan(self, mL, tok, tks, tke, rows, q4, n_tok, s_kv):
        """Where this lane's logits go, for a query block (`_epilogue` leaves each lane of a quad the
        sums of key row r = bit 1 of its quad index and of tokens j, `_owned`): (the key row within
        a tile, then per owned token: the output row's tensor, the first and one-past-last keys that
        get the logit (else -inf, clamped to S_kv), whether the lane stores at all)."""
        c = self.cfg
        b1 = (q4 & 2) != 0
        b0 = (q4 & 1) != 0
        key = cutlass.select_(b1, rows[1], rows[0])
        dsts = []
        for j_lo, j_hi in self._owned():
            t = cutlass.select_(b0, tok[j_hi], tok[j_lo])
            lo = cutlass.max(cutlass.select_(b0, tks[j_hi], tks[j_lo]), 0)
            hi = cutlass.min(cutlass.select_(b0, tke[j_hi], tke[j_lo]), s_kv)
            ok = t < n_tok
            if cutlass.const_expr(c.bq == 1):  # both lanes of a pair hold the sum: the even one stores
                ok = ok & ((q4 & 1) == 0)
            dsts.append((mL[(cutlass.min(t, n_tok - 1), None)], lo, hi, ok))
        return key, dsts

    def _owned(self):
        """The tokens of the sums a lane holds after `_quad_sum`: (token if bit 0 of its quad index is
        clear, token if set), one pair per sum."""
        bq = self.cfg.bq
        return [(0, 0)] if bq == 1 else [(m, bq // 2 + m) for m in range(bq // 2)]

    @cute.jit
    def _epilogue(self, acc, wreg, sc, s0, plan, q4):
        """Per (key row r, token j) the lane's sums (`_lane_sums`) x the key scale of its row, -inf
        outside the token's key range; one store a lane (no branches)."""
        key, dsts = plan
        s = s0 + key
        ninf = -cutlass.Float32.inf
        for (row, lo, hi, ok), v in zip(dsts, self._lane_sums(acc, wreg, q4)):
            out = cutlass.select_((s >= lo) & (s < hi), v * sc, ninf)
            if ok & (s < cute.size(row)):  # keys past S_kv (a tile's zero-filled rows): nowhere
                row[s] = out

    @cute.jit
    def _lane_sums(self, acc, wreg, q4):
        """The weighted head sums this lane owns (`_owned`): per (key row r, token j) the thread's 16
        heads of ReLU(acc) * w (2 chains), then the quad's reduction transposed so that each lane ends
        with whole sums of its own (`_quad_sum`)."""
        c = self.cfg
        acc_mn = mn_view(acc)
        vals = []
        for r in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(c.bq):
                part = [cutlass.Float32(0.0)] * 2
                for h in cutlass.range_constexpr(16):
                    cc = 16 * j + h
                    part[h % 2] = part[h % 2] + cute.arch.fmax(acc_mn[r, cc], cutlass.Float32(0.0)) * wreg[cc]
                vals.append(part[0] + part[1])
        return self._quad_sum(vals, q4)

    @staticmethod
    def _quad_sum(vals, q4):
        """Sum each of the 2 * bq values over the 4 lanes of a quad, transposed: at each butterfly
        step a lane keeps half of its values, sends the other half to its partner and adds what the
        partner sent, so the quad does 2 * bq / 4 shuffle-adds a step instead of 2 * bq (values
        r * bq + j: the lane keeps r = bit 1 of q4, then tokens by bit 0; with one value left the
        step is a plain butterfly)."""
        for off in (2, 1):
            bit = (q4 & off) != 0
            if len(vals) >= 2:
                half = len(vals) // 2
                lo, hi = vals[:half], vals[half:]
                vals = [cutlass.select_(bit, b, a) + cute.arch.shuffle_sync_bfly(cutlass.select_(bit, a, b), offset=off)
                        for a, b in zip(lo, hi)]
            else:
                vals = [vals[0] + cute.arch.shuffle_sync_bfly(vals[0], offset=off)]
        return vals
