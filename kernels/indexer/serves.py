"""The model ops this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py): the top-k
selection, and the scores on the logits kernel where that is exact.

`indexer_scores` takes fp32 queries and keys; the logits kernel takes e4m3 queries [T, 64, 128], e4m3
keys with one fp32 scale per key and fp32 per-head weights. With QAT on, the model's queries and keys
are FP4 values (e2m1 codes x power-of-two block scales, 2 significant bits), which e4m3 holds exactly
after a power-of-two scale per (token, head) row and per key: the key's goes into the key scale, the
query's into the head weight (w·ReLU(c·x) = (w·c)·ReLU(x) for c > 0, exact for c = 2^k). The adapter
checks the conversion is exact and refuses (Unsupported) otherwise — QAT off, another head count or
width, a row whose values span more than e4m3's exponent range — so the kernel sees the oracle's
operands exactly and differs only by its accumulation (the family's rule: within 2x the bf16
reference's error). A decode step (one token a sequence) packs the keys into the paged decode
kernel's pages, one launch for the batch; a prefill runs the logits kernel once a sequence, each query
row over its causal range [0, ⌊(t+1)/m⌋) of its own keys."""

from __future__ import annotations

import math

import torch

from dsv4bench.core.registry import Unsupported
from kernels.indexer.decode_glue import PAGE, cache_views
from kernels.indexer.logits_sm90 import HEAD_DIM, HEADS
from kernels.indexer.topk_glue import check_topk_args
from oracles.compressor import CSA_RATIO, visible_entries
from oracles.quant import ue8m0_scale

EXACT_IN_FP32 = (torch.float32, torch.bfloat16, torch.float16)  # scores the kernel ranks as given
E4M3_MAX = 448.0
AMAX_FLOOR = 2.0**-100  # an all-zero row: any scale is exact


def e4m3_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 codes, fp32 power-of-two scale per row [..., 1], a 0-d device bool: codes · scale == x
    exactly). The flag stays on the device, so a caller reads every operand's in one sync."""
    scale = ue8m0_scale(x.abs().amax(-1, keepdim=True).float().clamp(min=AMAX_FLOOR), E4M3_MAX)
    scaled = x.float() / scale
    codes = scaled.to(torch.float8_e4m3fn)
    return codes, scale, (codes.float() == scaled).all()


def _require_exact(flags: dict[str, torch.Tensor]) -> None:
    """Unsupported naming the operands e4m3 would round (one host read for all of them)."""
    for what, ok in zip(flags, torch.stack(list(flags.values())).tolist()):
        if not ok:
            raise Unsupported(f"indexer_scores: the {what} are not e4m3 values times a power of two per row (QAT "
                              "off, or a row wider than e4m3's range): the logits kernel would round them")


def indexer_scores(run, q, k, weights, positions, m: int = CSA_RATIO):
    """The model's `indexer_scores` op on the logits kernels: q [B, S, 64, 128], k [B, N, 128], weights
    [B, S, 64], positions [S] or [B, S] -> fp32 [B, S, N], -inf where s >= ⌊(t+1)/m⌋.

    One token a sequence (a decode step) runs the paged decode kernel over the keys packed into pages,
    [B, N] out; otherwise each sequence runs the logits kernel over its own keys, [S, N] out a launch
    (one varlen launch over all B·N keys would write a B·S x B·N output and keep its diagonal)."""
    b, s, h, d = q.shape
    n = k.shape[1]
    if (h, d) != (HEADS, HEAD_DIM):
        raise Unsupported(f"indexer_scores: the logits kernel takes {HEADS} heads of {HEAD_DIM}, got {h} x {d}")
    if n == 0:
        return torch.empty(b, s, 0, device=q.device)
    q8, qs, q_exact = e4m3_rows(q.reshape(b * s, h, d))
    k8, ks, k_exact = e4m3_rows(k.reshape(b * n, d))
    _require_exact({"queries": q_exact, "keys": k_exact})
    w = (weights.reshape(b * s, h).float() * qs[..., 0]).contiguous()  # exact: times 2^k
    visible = visible_entries(positions.to(q.device).expand(b, s), m).clamp(max=n).to(torch.int32)
    if s == 1:
        kv_cache, table = _pages(k8.view(b, n, d), ks.view(b, n))
        inputs = {"q": q8.contiguous(), "kv_cache": kv_cache, "w": w, "lens": visible.reshape(b).contiguous(),
                  "table": table}
        return run({"op": "decode", "t": b, "s_kv": n, "mask": "ragged"}, inputs)["logits"].view(b, 1, n)
    q8, w, k8 = q8.view(b, s, h, d), w.view(b, s, h), k8.view(b, n, d)
    sc = _aligned_rows(ks.view(b, n))
    zero = torch.zeros(s, dtype=torch.int32, device=q.device)
    rows = [run({"mask": "varlen", "t": s, "s_kv": n},
                {"q": q8[i].contiguous(), "kv": k8[i].contiguous(), "sc": sc[i, :n], "w": w[i].contiguous(),
                 "ks": zero, "ke": visible[i].contiguous()})["logits"] for i in range(b)]
    return rows[0][None] if b == 1 else torch.stack(rows)


def _aligned_rows(scales: torch.Tensor) -> torch.Tensor:
    """fp32 [B, N] with rows 16 bytes apart, so each sequence's scales start where the logits kernel's
    TMA can read them (row i of a [B, N] tensor starts at 4·N·i bytes: N = 75 puts row 1 at 300)."""
    b, n = scales.shape
    out = scales.new_empty(b, -(-n // 4) * 4)
    out[:, :n] = scales
    return out


def _pages(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's e4m3 keys [B, N, 128] and fp32 scales [B, N] written once into the decode kernel's
    paged cache (zero keys pad a sequence to whole pages; the kernel masks them by length), and its
    block table."""
    b, n, d = codes.shape
    per = -(-n // PAGE)
    cache = torch.zeros(b * per, PAGE, 1, d + 4, dtype=torch.uint8, device=codes.device)
    full, rest = divmod(n, PAGE)
    for view, src in zip(cache_views(cache), (codes, scales)):  # pages are strided: whole ones, then the rest
        view = view.unflatten(0, (b, per))
        view[:, :full] = src[:, :full * PAGE].unflatten(1, (full, PAGE))
        if rest:
            view[:, full, :rest] = src[:, full * PAGE:]
    table = torch.arange(b * per, dtype=torch.int32, device=codes.device).view(b, per)
    return cache, table


def indexer_topk(run, scores: torch.Tensor, topk: int) -> torch.Tensor:
    """The model's `indexer_topk` op on the top-k kernel: scores [..., N] (-inf = not visible) ->
    int64 [..., min(topk, N)], -1 = none. Each row holds the oracle's set (ties to the lower index),
    listed in ascending index order rather than by score: the op's output is a set (oracles/indexer.py)."""
    if scores.dtype not in EXACT_IN_FP32:
        raise Unsupported(f"indexer_topk: the kernel ranks float32 scores; {scores.dtype} would be rounded")
    rows = scores.reshape(math.prod(scores.shape[:-1]), scores.shape[-1]).float().contiguous()
    n_rows, n, width = check_topk_args(rows, topk)
    out = run({"op": "topk", "t": n_rows, "s_kv": n, "k": topk}, {"logits": rows})
    return out["indices"].long().reshape(*scores.shape[:-1], width)


OPS = {"indexer_scores": indexer_scores, "indexer_topk": indexer_topk}
