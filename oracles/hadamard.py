"""Walsh–Hadamard rotation oracle (docs/model-math.md §2.5, `[REF-M]` rotate_activation).

`y = x @ H_n · n^-0.5` with H_n the Sylvester (natural-order) Hadamard matrix; the indexer uses
n = 128. H_n·n^-0.5 is symmetric and orthonormal, so rotated dot products equal plain ones.
"""

from __future__ import annotations

import torch


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Unnormalised Sylvester Hadamard matrix [n, n] (entries ±1), n a power of two.

    H[i, j] = (−1)^popcount(i & j), i.e. H_{2n} = [[H_n, H_n], [H_n, −H_n]].
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def hadamard_rotate(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Oracle of `rotate_activation` (§2.5): x [..., n] → x @ H_n · n^-0.5 in `dtype` (fp32 or fp64)."""
    n = x.shape[-1]
    return (x.to(dtype) @ hadamard_matrix(n, dtype, x.device)) * n**-0.5


def hadamard_rotate_lowprec(x: torch.Tensor) -> torch.Tensor:
    """The reference's rotation: fast_hadamard_transform computes in fp32 and writes x.dtype."""
    return hadamard_rotate(x).to(x.dtype)
