"""The fmha family's `op: decode_fp8` cases: sparse decode over FlashMLA's two paged FP8 caches
(oracles/fmha_cache.py), as serving stacks call `flash_mla_with_kvcache(..., is_fp8_kvcache=True)`.

Inputs of a case (sweeps/fmha.py `_decode`): b requests of one query token, h_q heads, context
`s_kv` tokens per request (ragged: each request a length in [1, s_kv]), paged blocks of `block`
tokens (blocks permuted, as a block table would scatter them):
  cache0 / idx0 / len0  the window cache: a ring of `window` tokens per request; the last
                        min(window, length) positions, -1 past them
  cache1 / idx1 / len1  the compressed cache (CSA, one entry per 4 tokens): topk - window distinct
                        entries of the request's length // 4 (-1 past them), a fraction `invalid`
                        replaced by -1, `dup`: some slots repeat another slot's entry; ragged:
                        len1 cuts the list before its last valid entries
Only the selected tokens hold quantised rows; every other byte of the caches is random (an e4m3
code 0x7f / 0xff is NaN: a kernel reading the wrong token shows it).
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost
from oracles.fmha_cache import D, TOKEN_BYTES, empty_cache, sparse_decode_fp8, write_rows

COMPRESS = 4  # CSA: one compressed entry per 4 tokens


def is_decode(case: Case) -> bool:
    return case.get("op", "attention") == "decode_fp8"


def supports(case: Case) -> str | None:
    if case["hd"] != D or case["h_q"] % 64 or case["h_kv"] != 1 or not case["kv_shared"]:
        return "FP8 decode: d 512, h_q a multiple of 64, one latent kv head"
    return None


def _request_lengths(case: Case, gen: torch.Generator) -> torch.Tensor:
    b, ctx = case["b"], case["s_kv"]
    if case.get("ragged"):
        return torch.randint(1, ctx + 1, (b,), generator=gen)
    return torch.full((b,), ctx)


def _table(b: int, blocks: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(b * blocks, generator=gen).view(b, blocks)


def _to_cache(pos: torch.Tensor, table: torch.Tensor, bs: int) -> torch.Tensor:
    """Positions [b, n] (-1 = none) -> flat cache indices via the block table (FlashMLA's
    `abs_indices2indices_in_kvcache`)."""
    safe = pos.clamp_min(0)
    idx = table.gather(1, safe // bs) * bs + safe % bs
    return torch.where(pos >= 0, idx, torch.full_like(idx, -1))


def _window(case: Case, lens: torch.Tensor, gen) -> tuple:
    w, bs, b = case["window"], case["block"], case["b"]
    ring = -(-w // bs) * bs
    n_valid = torch.clamp(lens, max=w)
    j = torch.arange(w)[None, :]
    pos = (lens - n_valid)[:, None] + j  # the last n_valid positions, oldest first
    pos = torch.where(j < n_valid[:, None], pos % ring, torch.full_like(pos, -1))
    table = _table(b, ring // bs, gen)
    return _to_cache(pos, table, bs), n_valid, b * (ring // bs)


def _compressed(case: Case, lens: torch.Tensor, gen) -> tuple:
    k, bs, b = case["topk"] - case["window"], case["block"], case["b"]
    n_comp = lens // COMPRESS
    blocks = max(1, -(-int(n_comp.max()) // bs))
    pos = torch.full((b, k), -1, dtype=torch.long)
    for r in range(b):
        take = min(k, int(n_comp[r]))
        pos[r, :take] = torch.randperm(int(n_comp[r]), generator=gen)[:take]
    n_valid = (pos >= 0).sum(1)
    if case["invalid"] > 0:
        drop = torch.rand(pos.shape, generator=gen) < case["invalid"]
        pos = torch.where(drop, torch.full_like(pos, -1), pos)
    if case.get("dup") and k > 1:  # every 4th slot repeats a random earlier slot
        src = (torch.rand(b, k, generator=gen) * torch.arange(k)).long()
        rep = (torch.arange(k) % 4 == 3)[None, :] & (pos >= 0)
        pos = torch.where(rep, pos.gather(1, src), pos)
    cut = n_valid
    if case.get("ragged"):
        cut = (torch.rand(b, generator=gen) * (n_valid + 1).float()).long()
    return _to_cache(pos, _table(b, blocks, gen), bs), cut, b * blocks


def make_inputs(case: Case, gen: torch.Generator, device: str) -> dict:
    b, h, bs = case["b"], case["h_q"], case["block"]
    lens = _request_lengths(case, gen)
    x = {"q": torch.randn(b, h, D, generator=gen).to(torch.bfloat16)}
    if case["sink"]:
        x["sink"] = torch.randn(h, generator=gen) * 2.0
    dev_gen = torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    for i, (idx, ln, blocks) in enumerate((_window(case, lens, gen), _compressed(case, lens, gen))):
        cache = empty_cache(blocks, bs, device)
        cache.view(blocks, -1).random_(0, 256, generator=dev_gen)
        used = torch.unique(idx[idx >= 0]).to(device)
        rows = torch.randn(used.numel(), D, generator=dev_gen, device=device).to(torch.bfloat16)
        write_rows(cache, used, rows)
        x[f"cache{i}"], x[f"idx{i}"], x[f"len{i}"] = cache, idx.to(torch.int32), ln.to(torch.int32)
    return {k: v.to(device) for k, v in x.items()}


def attention(case: Case, x: dict, lowprec: bool) -> dict:
    out, lse = sparse_decode_fp8(
        x["q"], (x["cache0"], x["cache1"]), (x["idx0"], x["idx1"]), (x["len0"], x["len1"]), x.get("sink"),
        D ** -0.5, lowprec=lowprec)
    return {"out": out, "lse": lse}


def alloc_outputs(case: Case, device: str) -> dict:
    b, h = case["b"], case["h_q"]
    return {"out": torch.empty(b, h, D, dtype=torch.bfloat16, device=device),
            "lse": torch.empty(b, h, dtype=torch.float32, device=device)}


def cost(case: Case) -> Cost:
    """Flops 4 * b * h * slots * 512 (QK and PV over every slot, the family's convention); bytes: 584
    per slot (each request reads its own selected tokens) + its int32 index, q and O in bf16, lse."""
    b, h, n = case["b"], case["h_q"], case["topk"]
    return Cost(flops=4.0 * b * h * n * D, bytes=b * n * (TOKEN_BYTES + 4.0) + b * h * (2 * D * 2 + 4.0))
