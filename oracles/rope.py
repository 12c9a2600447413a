"""RoPE oracles: partial interleaved rotary embedding with YaRN tables (docs/model-math.md §2.2).

RoPE acts on the last `rope_dim` (= 64) dims of a vector; pair i is dims (2i, 2i+1) of that slice
(interleaved / GPT-J pairing). Compressed layers (ratio 4 or 128) use base 160000 with YaRN
(factor 16, L0 = 65536, beta_fast 32, beta_slow 1); SWA-only layers and MTP use base 10000 with
no YaRN. There is no mscale: |freqs_cis| = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_DIM = 64


@dataclass(frozen=True)
class RopeConfig:
    """One layer's RoPE table parameters (§1.1, §2.2). original_seq_len = 0 disables YaRN."""

    base: float
    original_seq_len: int = 0
    factor: float = 16.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    rope_dim: int = ROPE_DIM


SWA_ROPE = RopeConfig(base=10000.0)
COMPRESSED_ROPE = RopeConfig(base=160000.0, original_seq_len=65536)


def rope_config_for_ratio(compress_ratio: int) -> RopeConfig:
    """§2.2: ratio 0 (SWA-only, MTP) → theta 10000 without YaRN; ratio 4/128 → theta 160000 with YaRN."""
    return SWA_ROPE if compress_ratio == 0 else COMPRESSED_ROPE


def yarn_band(cfg: RopeConfig) -> tuple[int, int]:
    """(low, high) pair indices of the YaRN ramp: corr(n) = dim·ln(L0/(2πn)) / (2 ln base)."""
    def corr(rotations: float) -> float:
        return cfg.rope_dim * math.log(cfg.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(cfg.base))

    low = max(math.floor(corr(cfg.beta_fast)), 0)
    high = min(math.ceil(corr(cfg.beta_slow)), cfg.rope_dim - 1)
    return low, high


def rope_freqs(cfg: RopeConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-pair angular frequencies [rope_dim/2] (§2.2), built as `[REF-M]` builds them in `dtype`.

    dtype=float32 reproduces the reference bit for bit; float64 gives the true-math table.
    """
    i2 = torch.arange(0, cfg.rope_dim, 2, dtype=dtype)
    freqs = 1.0 / (cfg.base ** (i2 / cfg.rope_dim))
    if cfg.original_seq_len > 0:
        low, high = yarn_band(cfg)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(cfg.rope_dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.factor * (1 - smooth) + freqs * smooth
    return freqs


def freqs_cis(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Unit complex rotations exp(j·p·freq_i), [*positions.shape, rope_dim/2] (§2.2).

    In fp32 this is the reference's `polar(1, outer(arange, freqs))` row for each position;
    fp64 freqs give complex128.
    """
    angles = positions.to(freqs.dtype).unsqueeze(-1) * freqs
    return torch.polar(torch.ones_like(angles), angles)


def _rotate(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool,
            compute: torch.dtype | None = None) -> torch.Tensor:
    rope_dim = 2 * freqs.shape[-1]
    dt = compute or freqs.dtype
    rot = freqs_cis(positions, freqs).to(torch.complex128 if dt == torch.float64 else torch.complex64)
    if inverse:
        rot = rot.conj()
    pairs = torch.view_as_complex(x[..., -rope_dim:].to(dt).unflatten(-1, (-1, 2)).contiguous())
    rotated = torch.view_as_real(pairs * rot).flatten(-2)
    return torch.cat((x[..., :-rope_dim].to(dt), rotated), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False,
               compute: torch.dtype | None = None) -> torch.Tensor:
    """Oracle of RoPE on the last 2·len(freqs) dims of x (§2.2); inverse=True rotates by −θ (§7.3).

    x: [..., D]; positions: integer tensor broadcastable to x.shape[:-1] (e.g. [S, 1] for x [S, H, D]);
    freqs: from `rope_freqs` (fp32 or fp64). Returns x in freqs' dtype with the rope slice rotated; with
    `compute` (float64: the judge of an fp32 kernel) the rotations as freqs' dtype gives them, the arithmetic
    and the result in `compute`.
    """
    return _rotate(x, positions, freqs, inverse, compute)


def apply_rope_lowprec(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
                       inverse: bool = False) -> torch.Tensor:
    """The reference's RoPE: rotate in fp32 (complex multiply by fp32 freqs_cis), write back in x.dtype."""
    return _rotate(x, positions, freqs.float(), inverse).to(x.dtype)
