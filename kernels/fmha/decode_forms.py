"""Candidate forms of the fused FP8 decode (issue #25), each the default kernel (decode_prefetch.
FusedPackedLoop) with one seam overridden, A/B'd as `cutedsl:fused-*` variants (variants.py).

  FusedEpiTma (`cutedsl:fused-pk-epi`)  v11's epilogue (prefill_v11.EpiTma): each consumer warpgroup
        normalises its 64 x 256 of O in registers, stmatrix into its half of the Q buffer, one TMA
        store of the half. Why: `%clock` stamps in a one-request CTA (H100, session 21) put the
        scalar epilogue (128 STS.U16 a thread, two CTA-wide barriers, then 16-byte row stores) at
        ~23k of ~40k cycles. Applies where v11's does (64-head blocks: h_q 64 and 128); the default's
        epilogue elsewhere.
  FusedEpiPdl (`cutedsl:fused-pk-pdl`)  FusedEpiTma + the combine launched with programmatic dependent
        launch (decode_combine `pdl`), this kernel letting it start at once: the combine's launch and
        ramp overlap the attention kernel where it leaves SMs idle (1-32 requests: 5-80 CTAs).
"""

from __future__ import annotations

from kernels.fmha.decode_prefetch import FusedPackedLoop
from kernels.fmha.prefill_v11 import EpiTma


class FusedEpiTma(FusedPackedLoop, EpiTma):
    """The default FP8 decode with O stored by stmatrix + TMA (MRO: the decode's producer and frame,
    then EpiTma's `_epilogue` and V11Base's `_io_tma`)."""

    o_by_tma = True


class FusedEpiPdl(FusedEpiTma):
    """fused-pk-epi with the combine launched by PDL (module docstring)."""

    pdl_combine = True
