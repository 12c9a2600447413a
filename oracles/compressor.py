"""Token compressor oracles (docs/model-math.md §5): CSA (m = 4, overlapping) and HCA (m = 128).

Per token t (§5.2, fp32):  k_t = wkv(x_t),  z_t = wgate(x_t) + ape[t mod m]   (coff·d wide,
coff = 2 for m = 4, else 1). Entry s pools, per channel, a softmax over candidate scores:
* HCA (§5.3): the m tokens of block s.
* CSA (§5.4): the first halves (a) of block s−1 and the second halves (b) of block s: 2m = 8
  candidates in the order [prev-block a | own-block b]; for s = 0 the previous block is absent
  (kv 0, score −inf).
Post-processing (§5.5): RMSNorm(cast_bf16(c)) → RoPE at position s·m → main: FP8 qdq of the NoPE
dims; indexer: Hadamard then FP4 qdq. Entry s exists once token s·m + m − 1 is seen (§5.6).
`CompressorState` is the reference's decode-time state (§5.7).
"""

from __future__ import annotations

import torch

from oracles.hadamard import hadamard_rotate, hadamard_rotate_lowprec
from oracles.norm import NORM_EPS, rmsnorm, rmsnorm_lowprec
from oracles.projections import nope_fp8_qdq, nope_fp8_qdq_lowprec
from oracles.quant import fp4_qdq, fp4_qdq_lowprec
from oracles.rope import apply_rope, apply_rope_lowprec

CSA_RATIO = 4
HCA_RATIO = 128
INDEXER_FP4_BLOCK = 32


def overlaps(m: int) -> bool:
    """CSA (m = 4) overlaps with the previous block; every other ratio does not (§5.1)."""
    return m == CSA_RATIO


def num_entries(num_tokens: int, m: int) -> int:
    """§5.6: entries emitted after `num_tokens` tokens (prefill emits ⌊S/m⌋)."""
    return num_tokens // m


def visible_entries(t: torch.Tensor | int, m: int):
    """§5.6: a query at position t may use compressed entries s < ⌊(t+1)/m⌋."""
    return (t + 1) // m


def compressor_project(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor, ape: torch.Tensor,
                       positions: torch.Tensor):
    """§5.2: per-token projections in fp32 (the compressor runs its bf16 weights in fp32).

    x: [..., D]; wkv, wgate: [coff·d, D]; ape: [m, coff·d]; positions: integer t, x.shape[:-1].
    Returns (kv, score), both fp32 [..., coff·d]; score includes ape[t mod m].
    """
    x32 = x.float()
    m = ape.shape[0]
    return x32 @ wkv.float().T, x32 @ wgate.float().T + ape.float()[positions % m]


def pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Per-channel softmax pooling over the candidate dim: kv, score [..., n_cand, d] → [..., d]."""
    return (kv * score.softmax(dim=-2)).sum(dim=-2)


def block_candidates(kv: torch.Tensor, score: torch.Tensor, m: int):
    """Candidates of every complete block from prefill projections (§5.3/§5.4, `overlap_transform`).

    kv, score: [B, S, coff·d] for positions 0..S−1. Returns (kv, score), [B, ⌊S/m⌋, coff·m, d].
    """
    n = num_entries(kv.shape[1], m)
    kv_b = kv[:, :n * m].unflatten(1, (n, m))
    sc_b = score[:, :n * m].unflatten(1, (n, m))
    if not overlaps(m):
        return kv_b, sc_b
    d = kv.shape[-1] // 2
    prev_kv = torch.zeros_like(kv_b[..., :d])
    prev_sc = torch.full_like(sc_b[..., :d], float("-inf"))
    prev_kv[:, 1:], prev_sc[:, 1:] = kv_b[:, :-1, :, :d], sc_b[:, :-1, :, :d]
    return torch.cat((prev_kv, kv_b[..., d:]), dim=2), torch.cat((prev_sc, sc_b[..., d:]), dim=2)


def compress_prefill(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Raw (pre-norm) compressed entries of a prefill from position 0: x [B, S, D] → fp32 [B, ⌊S/m⌋, d]."""
    positions = torch.arange(x.shape[1], device=x.device)
    kv, score = compressor_project(x, wkv, wgate, ape, positions)
    return pool(*block_candidates(kv, score, ape.shape[0]))


def postprocess(c: torch.Tensor, norm_weight: torch.Tensor, entry_ids: torch.Tensor, m: int, freqs: torch.Tensor,
                indexer: bool = False, qat: bool = True, eps: float = NORM_EPS) -> torch.Tensor:
    """FP32 oracle of §5.5 on raw entries c [..., d] with entry indices s (shaped c.shape[:-1]).

    RMSNorm → RoPE on the last 64 dims at position s·m → main (indexer=False): FP8 qdq of the
    NoPE dims (block 64); indexer: Hadamard_d then FP4 qdq (block 32). qat=False skips the qdq.
    """
    c = apply_rope(rmsnorm(c, norm_weight, eps), entry_ids * m, freqs)
    if indexer:
        c = hadamard_rotate(c)
        return fp4_qdq(c, INDEXER_FP4_BLOCK) if qat else c
    return nope_fp8_qdq(c) if qat else c


def postprocess_lowprec(c: torch.Tensor, norm_weight: torch.Tensor, entry_ids: torch.Tensor, m: int,
                        freqs: torch.Tensor, indexer: bool = False, qat: bool = True,
                        eps: float = NORM_EPS) -> torch.Tensor:
    """The reference's §5.5 in bf16: cast_bf16(c) → norm → RoPE → (Hadamard) → in-place qdq, each in bf16."""
    c = apply_rope_lowprec(rmsnorm_lowprec(c.bfloat16(), norm_weight, eps), entry_ids * m, freqs)
    if indexer:
        c = hadamard_rotate_lowprec(c)
        return fp4_qdq_lowprec(c, INDEXER_FP4_BLOCK) if qat else c
    return nope_fp8_qdq_lowprec(c) if qat else c


class CompressorState:
    """The reference's decode-time compressor state (§5.7), one per layer and batch.

    kv, score: fp32 [B, coff·m, coff·d]; score starts at −inf. CSA keeps the previous block in
    slots [0, m) and the current one in [m, 2m); HCA uses slots [0, m).
    """

    def __init__(self, batch: int, m: int, width: int, device=None):
        """width = coff·d, the projection width (wkv.shape[0])."""
        self.m = m
        coff = 2 if overlaps(m) else 1
        self.kv = torch.zeros(batch, coff * m, width, device=device)
        self.score = torch.full((batch, coff * m, width), float("-inf"), device=device)

    @classmethod
    def after_prefill(cls, kv: torch.Tensor, score: torch.Tensor, m: int) -> "CompressorState":
        """The state the reference leaves after a prefill of S tokens from position 0 (§5.7).

        kv, score: the prefill's projections [B, S, coff·d] (score including ape).
        """
        state = cls(kv.shape[0], m, kv.shape[-1], kv.device)
        seqlen = kv.shape[1]
        cutoff = seqlen - seqlen % m
        offset = m if overlaps(m) else 0
        if overlaps(m) and cutoff >= m:
            state.kv[:, :m], state.score[:, :m] = kv[:, cutoff - m:cutoff], score[:, cutoff - m:cutoff]
        state.kv[:, offset:offset + seqlen - cutoff] = kv[:, cutoff:]
        state.score[:, offset:offset + seqlen - cutoff] = score[:, cutoff:]
        return state

    def push(self, kv_t: torch.Tensor, score_t: torch.Tensor, t: int) -> torch.Tensor | None:
        """Feed token t's projections kv_t, score_t [B, coff·d] (score including ape[t mod m]).

        Returns the raw entry s = t // m, fp32 [B, d], when t completes a block, else None.
        """
        m, slot = self.m, t % self.m
        offset = m if overlaps(m) else 0
        self.kv[:, offset + slot], self.score[:, offset + slot] = kv_t, score_t
        if (t + 1) % m:
            return None
        if not overlaps(m):
            return pool(self.kv, self.score)
        d = self.kv.shape[-1] // 2
        kv = torch.cat((self.kv[:, :m, :d], self.kv[:, m:, d:]), dim=1)
        score = torch.cat((self.score[:, :m, :d], self.score[:, m:, d:]), dim=1)
        self.kv[:, :m], self.score[:, :m] = self.kv[:, m:].clone(), self.score[:, m:].clone()
        return pool(kv, score)
