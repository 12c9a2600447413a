"""The paged decode kernel's glue: DeepGEMM's fused page layout (views, packing, a request's keys),
argument checks, the inputs of a case, the oracle over a request's gathered keys, the compile and
the call.

The cache (DeepGEMM `fp8_paged_mqa_logits`, SM90 block_kv = 64): uint8 [pages, 64, 1, 132], each page
64 x 128 e4m3 codes (8192 B, key-major) followed by the 64 keys' fp32 scales (256 B); q e4m3
[B, 64, 128] (DeepGEMM's [B, 1, 64, 128]), w fp32 [B, 64], lens int32 [B], table int32 [B, max_blocks]
(request b's key s is row s % 64 of page table[b, s // 64]), logits fp32 [B, W], -inf at s >= lens[b].
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import argument_check, compile_kernel, sm_count
from kernels.indexer.config import choose_parts
from kernels.indexer.decode_sm90 import PAGE, PAGE_BYTES, DecodeConfig, IndexerDecodeSm90
from kernels.indexer.logits_config import HEAD_DIM, HEADS

CODE_BYTES = PAGE * HEAD_DIM  # the codes of a page; its scales follow
KEY_CHUNK = 1 << 19  # keys quantised at a time when making a cache (256 MB of fp32)


def fake_args(cfg: DecodeConfig) -> tuple:
    """q (B*64, 128) fp8, codes (pages, 64, 128) fp8 and scales (pages, 64) fp32 (the cache's two
    views, page stride a multiple of 16 bytes), w (B, 64), lens (B,), table (B, max_blocks) int32
    (any row stride), logits (B, W) fp32 (any row stride), part_pages, n_parts."""
    b, bq, pages, blocks, width = (cute.sym_int32() for _ in range(5))
    fp8 = cutlass.Float8E4M3FN
    q = make_fake_tensor(fp8, (bq, HEAD_DIM), (HEAD_DIM, 1), assumed_align=16)
    codes = make_fake_tensor(fp8, (pages, PAGE, HEAD_DIM), (cute.sym_int64(divisibility=16), HEAD_DIM, 1),
                             assumed_align=16)
    scales = make_fake_tensor(cutlass.Float32, (pages, PAGE), (cute.sym_int64(divisibility=4), 1), assumed_align=16)
    w = make_fake_tensor(cutlass.Float32, (b, HEADS), (HEADS, 1), assumed_align=16)
    lens = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4)
    table = make_fake_tensor(cutlass.Int32, (b, blocks), (cute.sym_int64(), 1), assumed_align=4)
    out = make_fake_tensor(cutlass.Float32, (b, width), (cute.sym_int64(), 1), assumed_align=4)
    return q, codes, scales, w, lens, table, out, cutlass.Int32(1), cutlass.Int32(1)


def compile_decode(cfg: DecodeConfig = DecodeConfig(), arch: str = "sm_90a"):
    """Compile one configuration (no GPU needed)."""
    return compile_kernel(IndexerDecodeSm90(cfg), *fake_args(cfg), arch=arch)


# ---------------- the page layout ----------------

def cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused cache [pages, 64, 1, 132] as codes e4m3 (pages, 64, 128) and scales fp32 (pages, 64),
    views of the same memory."""
    n, ps, off = kv_cache.shape[0], kv_cache.stride(0), kv_cache.storage_offset()
    codes = kv_cache.as_strided((n, PAGE, HEAD_DIM), (ps, HEAD_DIM, 1), off).view(torch.float8_e4m3fn)
    scales = kv_cache.as_strided((n, PAGE * 4), (ps, 1), off + CODE_BYTES).view(torch.float32)
    return codes, scales


def pack_pages(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes e4m3 [pages, 64, 128] and scales fp32 [pages, 64] -> the fused cache uint8 [pages, 64, 1, 132]
    (DeepGEMM's `kv_cache_cast_to_fp8` layout)."""
    n = codes.shape[0]
    cache = torch.empty(n, PAGE_BYTES, dtype=torch.uint8, device=codes.device)
    cache[:, :CODE_BYTES] = codes.reshape(n, CODE_BYTES).view(torch.uint8)
    cache[:, CODE_BYTES:] = scales.reshape(n, PAGE).contiguous().view(torch.uint8)
    return cache.view(n, PAGE, 1, HEAD_DIM + 4)


def request_keys(kv_cache: torch.Tensor, table: torch.Tensor, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's first n keys as the kernel sees them: codes e4m3 [n, 128] and scales fp32 [n]."""
    codes, scales = cache_views(kv_cache)
    pages = table[b, :-(-n // PAGE)].long()
    return codes[pages].reshape(-1, HEAD_DIM)[:n], scales[pages].reshape(-1)[:n]


# ---------------- argument checks ----------------

def check_decode(q, kv_cache, w, lens, table, out) -> tuple[int, int]:
    """Validate the paged decode operands; ValueError naming the offending tensor. Returns (B, W).
    Values are not checked (a device sync): lengths are clamped to [0, min(W, 64 * max_blocks)] by
    the kernel, a page id outside [0, pages) reads zeros, and scales must be >= 0."""
    need = argument_check("indexer decode")
    need(isinstance(out, torch.Tensor), "out", f"must be a tensor, got {type(out).__name__}")
    need(out.dim() == 2, "out", f"must be 2-D, got shape {tuple(out.shape)}")
    need(out.dtype == torch.float32, "out", f"must be {torch.float32}, got {out.dtype}")
    n_req, width = out.shape
    check_paged_operands(q, kv_cache, w, lens, table, n_req, "indexer decode")
    need(out.stride(1) == 1 or width <= 1, "out", f"rows must be contiguous, got strides {tuple(out.stride())}")
    need(out.device == q.device, "out", f"must be on {q.device}, got {out.device}")
    return n_req, width


def check_paged_operands(q, kv_cache, w, lens, table, n_req: int, op: str) -> None:
    """The paged operands of n_req requests (check_decode's, for any op that reads them)."""
    need = argument_check(op)
    for name, t, dim in (("q", q, 3), ("kv_cache", kv_cache, 4), ("w", w, 2), ("lens", lens, 1), ("table", table, 2)):
        need(isinstance(t, torch.Tensor), name, f"must be a tensor, got {type(t).__name__}")
        need(t.dim() == dim, name, f"must be {dim}-D, got shape {tuple(t.shape)}")
    for name, t, dtype in (("q", q, torch.float8_e4m3fn), ("kv_cache", kv_cache, torch.uint8), ("w", w, torch.float32),
                           ("lens", lens, torch.int32), ("table", table, torch.int32)):
        need(t.dtype == dtype, name, f"must be {dtype}, got {t.dtype}")
    need(n_req < 65536, "q", f"has {n_req} requests; the grid takes at most 65535")
    need(tuple(q.shape) == (n_req, HEADS, HEAD_DIM) and q.is_contiguous(), "q",
         f"must be contiguous [B={n_req}, {HEADS}, {HEAD_DIM}], got {tuple(q.shape)} strides {tuple(q.stride())}")
    need(q.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0, "q", "and w must be 16-byte aligned (TMA)")
    need(tuple(kv_cache.shape[1:]) == (PAGE, 1, HEAD_DIM + 4), "kv_cache",
         f"must be [pages, {PAGE}, 1, {HEAD_DIM + 4}] (DeepGEMM's fused FP8 pages), got {tuple(kv_cache.shape)}")
    need(kv_cache.stride(1) == HEAD_DIM + 4 and kv_cache.stride(3) == 1 and kv_cache.stride(0) % 16 == 0
         and kv_cache.stride(0) >= PAGE_BYTES and kv_cache.data_ptr() % 16 == 0, "kv_cache",
         f"pages must be packed 8448-byte blocks at a 16-byte aligned stride (TMA), got strides {tuple(kv_cache.stride())}")
    need(tuple(w.shape) == (n_req, HEADS) and w.is_contiguous(), "w", f"must be contiguous [{n_req}, {HEADS}]")
    need(tuple(lens.shape) == (n_req,) and lens.is_contiguous(), "lens", f"must be contiguous [{n_req}]")
    need(table.shape[0] == n_req and table.stride(1) == 1, "table",
         f"must be [{n_req}, max_blocks] with contiguous rows, got {tuple(table.shape)} strides {tuple(table.stride())}")
    devs = {t.device for t in (q, kv_cache, w, lens, table)}
    need(len(devs) == 1, "q", f"and the other operands must be on one device, got {sorted(map(str, devs))}")


# ---------------- inputs and the oracle ----------------

def make_table(lens: list[int], max_blocks: int, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """A block table int32 [B, max_blocks] and the page count of its cache. shuffled: distinct pages
    in random order (3 spare pages never referenced); shared: every entry an independent random page
    of a pool a third of the size (ids repeat within and across requests). Entries past a request's
    pages are -1 (never read)."""
    need = [-(-n // PAGE) for n in lens]
    if kind == "shuffled":
        n_pages = sum(need) + 3
        ids = torch.randperm(n_pages, generator=gen)[:sum(need)].split(need)
    elif kind == "shared":
        n_pages = max(1, sum(need) // 3)
        ids = [torch.randint(0, n_pages, (k,), generator=gen) for k in need]
    else:
        raise ValueError(f"indexer decode: table must be shuffled or shared, got {kind!r}")
    table = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    for b, row in enumerate(ids):
        table[b, :len(row)] = row.to(torch.int32)
    return table, n_pages


def make_cache(n_pages: int, seed: int, device, keys: str = "randn") -> torch.Tensor:
    """Pages of random keys of varied norms (2^-3 .. 2^2), each quantised to e4m3 with an fp32 scale
    amax/448 (the FP8 indexer cache), made on `device` a chunk at a time; keys "equal": one such key
    in every row."""
    from oracles.quant import fp8_block_quant

    if keys not in ("randn", "equal"):
        raise ValueError(f"indexer decode: keys must be randn or equal, got {keys!r}")
    if keys == "equal":  # key 0 of a random page, codes and scale, in every row of every page
        codes, scales = cache_views(make_cache(1, seed, device))
        return pack_pages(codes[:1, :1].expand(n_pages, PAGE, HEAD_DIM), scales[:1, :1].expand(n_pages, PAGE))
    gen = torch.Generator(device).manual_seed(seed)
    codes = torch.empty(n_pages * PAGE, HEAD_DIM, dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty(n_pages * PAGE, dtype=torch.float32, device=device)
    for a in range(0, n_pages * PAGE, KEY_CHUNK):
        n = min(KEY_CHUNK, n_pages * PAGE - a)
        mag = torch.exp2(torch.randint(-3, 3, (n, 1), generator=gen, device=device).float())
        k = torch.randn(n, HEAD_DIM, generator=gen, device=device) * mag
        codes[a:a + n], sc = fp8_block_quant(k, HEAD_DIM, scale_fmt=None)
        scales[a:a + n] = sc.reshape(n)
    return pack_pages(codes.view(n_pages, PAGE, HEAD_DIM), scales.view(n_pages, PAGE))


def make_decode_inputs(lens: list[int], width: int, table: str = "shuffled", seed: int = 0, device="cpu",
                       pad_blocks: int = 0, keys: str = "randn") -> dict:
    """One decode step's operands: q / w as the prefill's (kernels/indexer/glue.py make_inputs), a
    block table of ceil(W / 64) + pad_blocks entries a request, and the paged cache it points into
    (make_cache's `keys`)."""
    from kernels.indexer.glue import make_inputs

    gen = torch.Generator().manual_seed(seed)
    tab, n_pages = make_table(lens, max(1, -(-width // PAGE)) + pad_blocks, table, gen)
    zero = torch.zeros(len(lens), dtype=torch.int32)
    x = make_inputs(len(lens), 0, zero, zero, seed, device)
    return {"q": x["q"], "kv_cache": make_cache(n_pages, seed, device, keys), "w": x["w"],
            "lens": torch.tensor(lens, dtype=torch.int32, device=device), "table": tab.to(device)}


def decode_reference(q, kv_cache, w, lens, table, width: int, lowprec: bool = False) -> torch.Tensor:
    """fp32 [B, W]: each request's row by kernels/indexer/glue.py `oracle_of` (oracles/indexer.py
    `indexer_scores` on the dequantised keys; `lowprec_of`: the reference's bf16 path) over its
    gathered keys, -inf past its length."""
    from kernels.indexer.glue import lowprec_of, oracle_of

    fn = lowprec_of if lowprec else oracle_of
    out = torch.full((q.shape[0], width), float("-inf"), device=q.device)
    zero = torch.zeros(1, dtype=torch.int32, device=q.device)
    for b, n in enumerate(lens.tolist()):
        n = max(0, min(n, width, PAGE * table.shape[1]))
        if n:
            kv, sc = request_keys(kv_cache, table, b, n)
            out[b, :n] = fn(q[b:b + 1], kv, sc, w[b:b + 1], zero, zero + n)[0]
    return out


# ---------------- the call ----------------

def run_decode(compiled, q, kv_cache, w, lens, table, out, part_pages: int | None = None):
    """out[B, W] <- the logits (every element written; -inf at s >= lens[b])."""
    n_req, width = out.shape
    if n_req == 0 or width == 0:
        return out
    pages = -(-width // PAGE)
    part = part_pages or choose_parts(n_req, pages, sm_count(q.device))
    codes, scales = cache_views(kv_cache)
    compiled(q.view(n_req * HEADS, HEAD_DIM), codes, scales, w, lens, table, out, part, -(-pages // part))
    return out
