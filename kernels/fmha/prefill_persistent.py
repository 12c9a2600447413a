"""A persistent form of v11 for the key split (`cutedsl:persistent`, issue #25): one CTA per SM walks the
(token, head block) items in the snake order of scheduler.py instead of one CTA an item.

Why: per CTA, v11 is ~1 us a CTA slower than FlashMLA at the same per-tile cost (Flash at s_q 4096: 10
tiles a CTA, 0.95-0.97x; docs/perf/fmha.md, "Open gaps"). One CTA an item pays, serially, the launch,
the barrier set-up and the first pair's index loads and gather before its first QK. Here the producer
runs ahead into the next item: its indices and first pair land while the consumers finish the last
pair and the epilogue, and only Q waits for the Q buffer (O is staged there for its TMA store).

The Q buffer's hand-off: each consumer warpgroup's warp 0 waits until its TMA store has read O out of
the buffer, then one lane arrives on q_empty (2 arrivals an item); the producer's next Q load waits
on it. The stage phases run on across items (`pair_base`, key_split.py / producer.py)."""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute

from kernels.fmha.config import Config
from kernels.fmha.prefill_v11 import V11, bulk_prefetch_l2


class PersistentKeySplitConfig(Config):
    """A Config whose key split with per-token lists in whole 64-head blocks (v11's shapes) is persistent."""

    @property
    def persistent(self) -> bool:
        return (self.key_split and self.per_token_idx and self.hpg % 64 == 0) or Config.persistent.fget(self)


class PersistentV11(V11):
    def __init__(self, cfg: Config):
        super().__init__(PersistentKeySplitConfig(**dataclasses.asdict(cfg)))

    def _persistent_key_split(self) -> bool:
        return self.cfg.persistent and self._v11_applies()

    def _q_empty_arrivals(self) -> int:
        """One lane of each consumer warpgroup, once its TMA store has read its half of O out of sQ."""
        return 2 if self._persistent_key_split() else V11._q_empty_arrivals(self)

    @cute.jit
    def _item_done(self, q_empty, wtid):
        if cutlass.const_expr(self._persistent_key_split()):
            if wtid < 32:  # warp 0 issued the TMA store and its lane waited for the reads (EpiTma)
                cute.arch.sync_warp()
                if wtid == 0:
                    cute.arch.mbarrier_arrive(q_empty)


class PersistentQPrefetch(PersistentV11):
    """cutedsl:persistent whose producer, as it loads an item's Q, pulls the CTA's next item's Q tile into L2
    (one bulk prefetch): at an item boundary Q then comes from L2 after the Q buffer is handed back."""

    @cute.jit
    def _load_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full):
        V11._load_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full)
        if cutlass.const_expr(self._persistent_key_split()):
            if ptid == 32:
                c = self.cfg
                n_hblk_all = cute.size(mQ, mode=[1]) // c.hb  # whole 64-head blocks (v11's shapes)
                g, _, _ = cute.arch.grid_dim()
                cta, _, _ = cute.arch.block_idx()
                hblk = kvh * c.n_hblk + (head0 - kvh * c.hpg) // c.hb
                i = (bidx * n_hblk_all + hblk) * s_q + (s_q - 1 - tok0)  # this item in the snake order
                w = i // g + 1
                nxt = w * g + cutlass.select_(w % 2 == 0, cta, g - 1 - cta)  # scheduler._item's order
                if nxt < s_q * n_hblk_all * cute.size(mQ, mode=[3]):
                    hb2 = (nxt // s_q) % n_hblk_all
                    kvh2 = hb2 // c.n_hblk
                    head2 = kvh2 * c.hpg + (hb2 % c.n_hblk) * c.hb
                    q2 = mQ[s_q - 1 - nxt % s_q, head2, None, nxt // (s_q * n_hblk_all)].iterator.toint()
                    bulk_prefetch_l2(q2, c.m_cta * c.d * 2)
