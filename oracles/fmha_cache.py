"""FlashMLA's FP8 sparse KV cache ("MODEL1_FP8Sparse", the DSV4 decode cache) and the decode
oracle over it: dequantise the gathered rows, then the sparse-attention oracle (oracles/fmha.py).

Layout (FlashMLA tests/quant.py, `quantize_k_cache`, MODEL1): a paged cache of blocks of `bs` tokens,
each token 584 bytes, but stored per block, not per token:
    bytes [0, bs*576)            token t at t*576: 448 e4m3 NoPE codes, then 64 bf16 RoPE values (128 B)
    bytes [bs*576, bs*584)       token t at bs*576 + t*8: 7 ue8m0 scales (NoPE tile i = codes
                                 64i..64i+63), 1 pad byte
A block occupies bs*584 bytes, padded to a multiple of 576 (bs 64: 37376 -> 37440); FlashMLA's
tensor is that buffer viewed as [blocks, bs, 1, 584] (block stride = the padded size). An index is
block * bs + token (FlashMLA's `indices_in_kvcache`), -1 = none.

Quantisation (FlashMLA's formula): per token and tile, s = 2^ceil(log2(max(amax / 448, 1e-4))),
code = e4m3(x / s) (round to nearest even, saturating is not applied: |x / s| <= 448 by construction);
RoPE values stay bf16. Dequantisation: bf16(code) * bf16(s), exact in bf16 (a 4-bit significand
times a power of two).
"""

from __future__ import annotations

import torch

from oracles.fmha import sparse_attention

D, D_NOPE, D_ROPE, TILE, N_TILES = 512, 448, 64, 64, 7
ROW_BYTES = D_NOPE + 2 * D_ROPE  # 576: codes + rope of one token
TOKEN_BYTES = ROW_BYTES + N_TILES + 1  # 584
E4M3_MAX = 448.0


def block_bytes(bs: int) -> int:
    """The padded size of one block (FlashMLA rounds bs*584 up to a multiple of 576)."""
    return -(-bs * TOKEN_BYTES // 576) * 576


def ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """FlashMLA's `_cast_scale_inv_to_ue8m0(amax / 448)`: the power of two at or above amax / 448."""
    return torch.pow(2, torch.clamp_min(amax.float() / E4M3_MAX, 1e-4).log2().ceil())


def cache_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA's cache [blocks, bs, 1, 584] (any 1-byte dtype) as (codes e4m3 [blocks, bs, 448],
    rope bf16 [blocks, bs, 64], scale exponents uint8 [blocks, bs, 8]): views of the same memory."""
    nb, bs = cache.shape[:2]
    stride, off = cache.stride(0), cache.storage_offset()
    u8 = cache.view(torch.uint8)
    rows = u8.as_strided((nb, bs, ROW_BYTES), (stride, ROW_BYTES, 1), off)
    codes = rows[..., :D_NOPE].view(torch.float8_e4m3fn)
    rope = rows.view(torch.bfloat16)[..., D_NOPE // 2:]
    scales = u8.as_strided((nb, bs, 8), (stride, 8, 1), off + bs * ROW_BYTES)
    return codes, rope, scales


def empty_cache(nb: int, bs: int, device=None) -> torch.Tensor:
    """An uninitialised cache of nb blocks as FlashMLA allocates it: uint8 [nb, bs, 1, 584] over
    padded blocks."""
    buf = torch.empty(nb, block_bytes(bs), dtype=torch.uint8, device=device)
    return buf[:, : bs * TOKEN_BYTES].view(nb, bs, 1, TOKEN_BYTES)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 rows [..., 512] -> (codes e4m3 [..., 448], rope bf16 [..., 64], exponents uint8 [..., 7])."""
    nope = x[..., :D_NOPE].float().unflatten(-1, (N_TILES, TILE))
    s = ue8m0_scale(nope.abs().amax(-1))
    codes = (nope / s[..., None]).to(torch.float8_e4m3fn).flatten(-2)
    exps = (torch.log2(s).round().to(torch.int32) + 127).to(torch.uint8)
    return codes, x[..., D_NOPE:].to(torch.bfloat16), exps


def write_rows(cache: torch.Tensor, index: torch.Tensor, x: torch.Tensor) -> None:
    """Quantise bf16 rows x [n, 512] into the cache at flat token indices `index` [n] (>= 0)."""
    codes, rope, scales = cache_views(cache)
    bs = cache.shape[1]
    blk, tok = index.long() // bs, index.long() % bs
    c, r, e = quantize_rows(x)
    codes[blk, tok] = c
    rope[blk, tok] = r
    scales[blk, tok, :N_TILES] = e


def quantize_fp8_kvcache(k: torch.Tensor) -> torch.Tensor:
    """A whole bf16 cache [blocks, bs, 1 or absent, 512] -> FlashMLA's FP8 cache [blocks, bs, 1, 584]."""
    k = k.reshape(k.shape[0], k.shape[1], D)
    nb, bs = k.shape[:2]
    cache = empty_cache(nb, bs, k.device)
    cache.view(nb, -1).zero_()  # the pad bytes
    write_rows(cache, torch.arange(nb * bs, device=k.device), k.reshape(-1, D))
    return cache


def dequant_rows(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """bf16 [n, 512]: the dequantised tokens at flat indices `index` [n] (invalid ones read token 0;
    the caller masks them)."""
    codes, rope, scales = cache_views(cache)
    bs = cache.shape[1]
    safe = index.long().clamp(0, cache.shape[0] * bs - 1)
    blk, tok = safe // bs, safe % bs
    s = scales[blk, tok, :N_TILES].view(torch.float8_e8m0fnu).to(torch.bfloat16)
    nope = codes[blk, tok].to(torch.bfloat16).unflatten(-1, (N_TILES, TILE)) * s[..., None]
    return torch.cat([nope.flatten(-2), rope[blk, tok]], dim=-1)


def dequant_fp8_kvcache(cache: torch.Tensor) -> torch.Tensor:
    """FlashMLA's `dequantize_k_cache` (MODEL1): bf16 [blocks, bs, 1, 512]."""
    nb, bs = cache.shape[:2]
    return dequant_rows(cache, torch.arange(nb * bs, device=cache.device)).view(nb, bs, 1, D)


def valid_slots(idx: torch.Tensor, lens: torch.Tensor | None, n_tokens: int) -> torch.Tensor:
    """bool [b, k]: slot j of request r is read when j < lens[r] and 0 <= idx[r, j] < n_tokens."""
    ok = (idx >= 0) & (idx < n_tokens)
    if lens is not None:
        ok &= torch.arange(idx.shape[1], device=idx.device)[None, :] < lens[:, None]
    return ok


def gather_decode_keys(caches, indices, lens) -> tuple[torch.Tensor, torch.Tensor]:
    """The union of the caches' selected keys per request: (bf16 [b, n, 512] dequantised, zero where
    not valid; bool [b, n] valid), n the sum of the index lists' widths, slots in list order (cache 0
    first)."""
    rows, oks = [], []
    for cache, idx, ln in zip(caches, indices, lens):
        b, k = idx.shape
        ok = valid_slots(idx, ln, cache.shape[0] * cache.shape[1])
        keys = dequant_rows(cache, idx.reshape(-1)).view(b, k, D)
        rows.append(torch.where(ok[..., None], keys, torch.zeros_like(keys)))  # unread bytes may be NaN codes
        oks.append(ok)
    return torch.cat(rows, 1), torch.cat(oks, 1)


def sparse_decode_fp8(q, caches, indices, lens, sink, scale: float, lowprec: bool = False):
    """Sparse decode over FP8 caches (FlashMLA `flash_mla_with_kvcache(is_fp8_kvcache=True,
    indices, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length, attn_sink)`).

    q [b, h, 512] bf16 (one query token per request); caches: FlashMLA FP8 caches; indices: int32
    [b, k_i] per cache (flat token indices, -1 = none); lens: int32 [b] per cache or None (slots at or
    past lens[r] are skipped); sink [h] fp32 or None, applied once over the union.
    Returns (out [b, h, 512] fp32 (bf16 if lowprec), lse [b, h] natural log, sink-free, -inf where a
    request has no valid key)."""
    keys, ok = gather_decode_keys(caches, indices, lens)
    b, n = ok.shape
    flat = torch.arange(b * n, device=q.device).view(b, n)
    idx = torch.where(ok, flat, torch.full_like(flat, -1))
    return sparse_attention(q, keys.reshape(b * n, D), idx, sink, scale, lowprec=lowprec)
