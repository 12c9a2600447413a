"""Interleaved RoPE pieces shared by the RoPE and compressor kernels (spec §2.2).

Table: one fp32 row per position, `[cos_0, sin_0, cos_1, sin_1, ...]` (64 values for the 64 rope
dims), i.e. the reference's `freqs_cis` viewed as real. Column c of the table belongs to rope dim c,
so a thread that holds rope dims [c, c+v) loads table columns [c, c+v) with the same vector width.
"""

from __future__ import annotations

import torch

from oracles.rope import ROPE_DIM, freqs_cis


def rope_table(freqs: torch.Tensor, n_positions: int, device) -> torch.Tensor:
    """fp32 [n_positions, 2·len(freqs)]: the reference's polar(1, p·freq) rows, (cos, sin) interleaved."""
    return rope_rows(torch.arange(n_positions, device=device), freqs.to(device))


def rope_rows(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The table rows of the given positions (fp32 [len(positions), 2·len(freqs)]): a model op's
    table holds only its own tokens' rows (row i for token i), not every position up to the largest."""
    return torch.view_as_real(freqs_cis(positions, freqs)).flatten(-2).contiguous()


def rotate_pairs(vals, cos_sin, n: int, inverse: bool) -> None:
    """In place on fp32 register fragments: pairs (2i, 2i+1) of `vals` rotated by (cos, sin) pair i of
    `cos_sin` (the complex product with exp(±jθ), written out as the reference's complex multiply)."""
    for i in range(n // 2):  # trace-time unrolled: this helper is plain Python called from a kernel
        a, b = vals[2 * i], vals[2 * i + 1]
        c, s = cos_sin[2 * i], cos_sin[2 * i + 1]
        if inverse:
            vals[2 * i] = a * c + b * s
            vals[2 * i + 1] = b * c - a * s
        else:
            vals[2 * i] = a * c - b * s
            vals[2 * i + 1] = a * s + b * c


__all__ = ["ROPE_DIM", "rope_table", "rotate_pairs"]
