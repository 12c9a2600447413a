"""Inputs of the moe family's cases: the routing of each expert load (sweeps/moe.py), the routed
experts' weights in the checkpoint's MXFP4 format, and the layout sizes a case implies.

The routing is a function of the case (its own generator, seeded from the case id), so the cost
model and the output buffers (the masked layout's max_m) know it without the inputs being made.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from dsv4bench.core.case import Case
from oracles.linear import QuantWeight
from oracles.moe import ExpertWeights, TILE_M, contiguous_rows

ZIPF_EXPONENT = 1.2
SPARSE_FRACTION = 8  # the sparse load uses the first E/8 experts (at least k: distinct per token)
MASKED_ALIGN = 16  # max_m of a masked case: the largest count rounded up to this
FP4_BLOCK = 32
WEIGHT_EXP = -8  # MXFP4 scale exponents around 2^-8 (dequantised weights of rms ~0.01-0.02, like
EXP_SPREAD = 3   # a trained layer's) with a spread of 3 binades: the FP8 128x128 conversion is exact


def _generator(case_id: str, purpose: str) -> torch.Generator:
    seed = int(hashlib.sha256(f"{case_id}:{purpose}".encode()).hexdigest()[:15], 16)
    return torch.Generator().manual_seed(seed)


def _distinct(probs: torch.Tensor, t: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """k distinct experts per token drawn by `probs` (with replacement when there are fewer than k)."""
    probs = probs.float()
    replace = int((probs > 0).sum()) < k
    return torch.multinomial(probs.expand(t, -1).contiguous(), k, replacement=replace, generator=gen)


def _routing(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    return _routing_of(case.id, tuple(sorted(case.params.items())))


@functools.lru_cache(maxsize=64)
def _routing_of(case_id: str, params: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    case = dict(params)
    t, k, e, load = case["t"], case["k"], case["e"], case["load"]
    gen = _generator(case_id, "routing")
    uniform = torch.ones(e)
    if load == "uniform":
        idx = _distinct(uniform, t, k, gen)
    elif load == "zipf":
        rank = torch.randperm(e, generator=gen).float() + 1
        idx = _distinct(rank ** -ZIPF_EXPONENT, t, k, gen)
    elif load == "hot":  # expert 0 in every token's first slot, k - 1 other experts after it
        rest = _distinct(torch.arange(e) > 0, t, k - 1, gen) if e > 1 else torch.zeros(t, k - 1, dtype=torch.long)
        idx = torch.cat([torch.zeros(t, 1, dtype=torch.long), rest], 1)
    elif load == "sparse":
        idx = _distinct(torch.arange(e) < max(k, e // SPARSE_FRACTION), t, k, gen)
    elif load == "hash":
        idx = torch.randint(0, e, (t, k), generator=gen)
    else:
        raise ValueError(f"load={load!r} is not one of uniform, zipf, hot, sparse, hash")
    scores = torch.rand(t, k, generator=gen) + 0.1
    weights = scores / scores.sum(-1, keepdim=True) * case["scale"]
    return idx.int(), weights.float()


def routing(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids int32 [T, k], route weights fp32 [T, k] summing to the route scale) of the case."""
    idx, w = _routing(case)
    return idx.clone(), w.clone()


def counts(case: Case) -> torch.Tensor:
    """Routed entries per expert (int64 [E])."""
    return torch.bincount(_routing(case)[0].reshape(-1).long(), minlength=case["e"])


def max_m(case: Case) -> int:
    """Rows per expert of a masked case: the largest count, rounded up to MASKED_ALIGN."""
    return -(-max(1, int(counts(case).max())) // MASKED_ALIGN) * MASKED_ALIGN


def count_stats(c: torch.Tensor) -> tuple[int, float]:
    """(the largest count, the entries over the experts that hold any) of per-expert counts, in one host read: the
    masked layout's max_m and CompiledLayer.gemms' wide-pair pick."""
    worst, active, total = torch.stack((c.max(), (c > 0).sum(), c.sum())).tolist()
    return worst, total / max(1, active)


def mean_rows(case: Case) -> float:
    """Routed entries over the experts that hold any (count_stats)."""
    return count_stats(counts(case))[1]


def layout_rows(case: Case) -> int:
    """Rows of the case's layout: E * max_m (masked), or the bound `contiguous_rows` (contiguous)."""
    if case["layout"] == "masked":
        return case["e"] * max_m(case)
    return contiguous_rows(case["t"], case["k"], case["e"], TILE_M)


@dataclass(frozen=True)
class StackedExperts:
    """The routed experts of a layer, each weight stacked over experts as the checkpoint stores one
    expert's: w1 / w3 int8 [E, I, D/2] (+ e8m0 scales [E, I, D/32]), w2 int8 [E, D, I/2] (+ [E, D, I/32]).
    `experts[e]` is expert e as the oracle takes it (oracles.moe.ExpertWeights of QuantWeights)."""

    w1: torch.Tensor
    s1: torch.Tensor
    w3: torch.Tensor
    s3: torch.Tensor
    w2: torch.Tensor
    s2: torch.Tensor

    def __getitem__(self, e: int) -> ExpertWeights:
        return ExpertWeights(QuantWeight(self.w1[e], self.s1[e]), QuantWeight(self.w2[e], self.s2[e]),
                             QuantWeight(self.w3[e], self.s3[e]))

    def __len__(self) -> int:
        return self.w1.shape[0]


def _mxfp4(e: int, rows: int, cols: int, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.randint(-128, 128, (e, rows, cols // 2), generator=gen, dtype=torch.int8, device=gen.device)
    exps = WEIGHT_EXP + 127 + torch.randint(0, EXP_SPREAD, (e, rows, cols // FP4_BLOCK), generator=gen,
                                            device=gen.device)
    return codes.to(device), exps.to(torch.uint8).to(device).view(torch.float8_e8m0fnu)


def make_experts(e: int, d: int, i: int, gen: torch.Generator, device: str) -> StackedExperts:
    """E routed experts of random MXFP4 codes (every byte a valid e2m1 pair) and e8m0 scales."""
    w1, s1 = _mxfp4(e, i, d, gen, device)
    w3, s3 = _mxfp4(e, i, d, gen, device)
    w2, s2 = _mxfp4(e, d, i, gen, device)
    return StackedExperts(w1, s1, w3, s3, w2, s2)


def expert_bytes(d: int, i: int) -> int:
    """One routed expert's checkpoint bytes: three MXFP4 matrices of I x D, codes and scales."""
    return 3 * (i * d // 2 + i * d // FP4_BLOCK)
