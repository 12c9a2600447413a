"""The indexer's compressor prefill in CuTeDSL (spec §5.4-§5.5 indexer branch, §6): the CSA kernel
(`CsaKernel`: m = 4, overlapping blocks, a CTA per entry) at the indexer's entry width d = 128, with
the indexer's quantise step in place of the main compressor's FP8 NoPE qdq:

    out[b, s] = fp4_qdq( Hadamard_128( RoPE_{s·m}( RMSNorm_w(c) ) ), block 32 )      (fp32 math)

A CTA is one warp (128 channels, 4 a lane): the pooling and `norm_rope` are CsaKernel's / EntryKernel's,
the Hadamard butterfly and the MXFP4 round trip are the decode post-processing's device code
(kernels/compressor_decode/decode.py `hadamard_fp4`), imported, not copied. The entry is stored bf16
by `EntryKernel.finish`: an e2m1 value times a power-of-two scale has at most 2 significant bits, so
the store is exact. One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass.cute as cute

from kernels.compressor.compressor import CsaKernel
from kernels.compressor_decode.decode import INDEXER_D, hadamard_fp4
from oracles.compressor import CSA_RATIO


class IndexerCsaKernel(CsaKernel):
    """Compile-time: m (4), d (128), eps. The seam is `EntryKernel.quantise` (called by `finish`)."""

    def __init__(self, m: int, d: int, eps: float = 1e-6):
        if m != CSA_RATIO:
            raise ValueError(f"the indexer's compressor is CSA (m = {CSA_RATIO}), got m = {m}")
        if d != INDEXER_D:
            raise ValueError(f"the indexer's post-processing is a Hadamard over {INDEXER_D} channels, got d = {d}")
        super().__init__(m, d, eps)

    @cute.jit
    def quantise(self, y, lane):
        """The indexer's QAT: Hadamard_128 then FP4 (e2m1, ue8m0 per 32) qdq of the whole entry (one warp)."""
        hadamard_fp4(y, lane)
