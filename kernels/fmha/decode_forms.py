"""Layers of the fused FP8 decode (issue #25) over the kernel and its producer (decode_prefetch.
FusedPackedLoop), each overriding one seam; the default stacks them (decode_pair.FusedQTma). Each was
A/B'd as a `cutedsl:fused-*` variant (runs and variants in git history at 1c17d89; docs/perf/fmha.md).

  FusedEpiTma (v4, `fused-pk-epi`)  v11's epilogue (prefill_v11.EpiTma): O normalised in registers,
        stmatrix into the Q buffer, one TMA store per warpgroup, instead of 128 STS.U16 a thread and two
        CTA-wide barriers (~23k of a one-request CTA's ~40k cycles); where v11's applies (64-head blocks).
  QByTma (v5, `fused-pk-qtma`, over decode_pair's head pair)  Q by one TMA load issued by
        producer warp 0 (arrive.expect_tx on q_full) instead of 32 cp.async a producer thread queued ahead
        of the slot tokens' copies (v11's q-first for the decode: the rows mode of q has stride 0, so the
        box is taken over (heads, d, requests)).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from kernels.fmha.decode_prefetch import FusedPackedLoop
from kernels.fmha.prefill_v11 import EpiTma


class FusedEpiTma(FusedPackedLoop, EpiTma):
    """The default FP8 decode with O stored by stmatrix + TMA (MRO: the decode's producer and frame,
    then EpiTma's `_epilogue` and V11Base's `_io_tma`)."""

    o_by_tma = True


class QByTma:
    """Mixin of a fused decode form (before it in the bases): Q by TMA (module docstring)."""

    def _q_full_arrivals(self) -> int:
        return 1

    def _io_tma(self, mQ, mO, sQ_layout):
        """The form's O atoms (EpiTma) + a Q atom over q without its stride-0 rows mode."""
        _, _, tma_o, mO_c = super()._io_tma(mQ, mO, sQ_layout)
        c = self.cfg
        mQ_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[1, 2, 3]))  # (heads, d, requests)
        sQ_2d = cute.slice_(sQ_layout, (None, None, 0))
        tma_q, mQ_c = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mQ_t, sQ_2d, (c.m_cta, c.d))
        return tma_q, mQ_c, tma_o, mO_c

    @cute.jit
    def _fetch_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full):
        """Producer warp 0 loads the CTA's 64 x 512 Q tile by TMA (lesson 18: the whole warp calls the
        copy, one lane arms the barrier); the other warps go on to the slot tokens at once."""
        c = self.cfg
        if ptid < 32:
            tma_q, mQ_c = io[0], io[1]
            g = cute.local_tile(cute.domain_offset((head0, 0), mQ_c[None, None, bidx]), (c.m_cta, c.d), (0, 0))
            t_s, t_g = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                             cute.group_modes(g, 0, 2))
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(q_full, c.m_cta * c.d * 2)
            cute.copy(tma_q, t_g, t_s, tma_bar_ptr=q_full)
