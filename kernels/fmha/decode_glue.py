"""FP8 sparse decode over FlashMLA's two paged FP8 caches (oracles/fmha_cache.py: the layout), as
three launches:

v1 (`run_decode`, the impl `cutedsl:decode-v1`):
1. decode_fp8.DequantGather: each request's selected tokens of both caches -> bf16 W [b, n_pad, 512]
   and its index list Widx (j, or -1 where the slot is not read).
2. the gathered-key attention kernel (kernel_sm90.py, unchanged) over W. Split-KV: the request's
   slots are cut into `n_split` chunks that become the kernel's query rows: q has a stride-0 row
   mode (every row is the request's one token), row s's index list is Widx[r, s*chunk:(s+1)*chunk],
   the kv batch entry r is W[r]. Grid = n_split x head blocks x requests.
3. decode_combine.DecodeCombine (n_split > 1 only): the log-sum-exp merge and the sink. With one
   split the attention kernel applies the sink and writes the outputs directly.

The fused forms (`run_fused`, the impl `cutedsl`): a decode_fused.FusedDecodeSm90 form, the attention
kernel whose producer gathers and dequantises the FP8 rows itself (no W), + the same combine.

The split count (`plan`): CTAs = n_split x (h_q / 64) x b, chunks of whole 128-key pairs (the
key-split consumers take tiles in pairs), the count that minimises a wave model of the kernel.
"""

from __future__ import annotations

import torch

from kernels.common import Prepared, compile_kernel
from kernels.fmha.compiling import NO_WINDOW, compile_config
from kernels.fmha.config import LOG2E, Config
from kernels.fmha.decode_combine import DecodeCombine
from kernels.fmha.decode_combine import fake_args as combine_fake_args
from kernels.fmha.decode_fp8 import DequantGather
from kernels.fmha.decode_fp8 import fake_args as gather_fake_args
from kernels.fmha.decode_prefetch import PACK_BITS
from oracles.fmha_cache import cache_views

D = 512
PAIR = 128  # keys per split granule


def attention_config(h_q: int) -> Config:
    return Config(d=D, dv=D, hpg=h_q, kv_shared=True, per_token_idx=True)


# Time model of the plan (H100, issue #25's fit of the attention kernel per CTA): fixed + per 64-key
# tile, one CTA per SM (~200 KB of smem), waves of CTAs; a combine launch when split.
CTA_FIXED_US, TILE_US, COMBINE_US = 8.1, 1.74, 3.0


def plan(b: int, h_q: int, n_slots: int, sms: int) -> tuple[int, int]:
    """(n_split, chunk): chunks of whole 128-key pairs minimising waves x (fixed + tiles x per-tile)
    (+ the combine when split): filling the SMs pays only until it costs a second wave."""
    pairs = max(1, -(-n_slots // PAIR))
    units = b * max(1, h_q // 64)

    def cost(per: int) -> float:
        n_split = -(-pairs // per)
        waves = -(-n_split * units // sms)
        return waves * (CTA_FIXED_US + TILE_US * per * PAIR / 64) + (COMBINE_US if n_split > 1 else 0.0)

    per = min(range(1, pairs + 1), key=lambda p: (cost(p), p))
    return -(-pairs // per), per * PAIR


class CompiledDecode:
    """The three compiles; `kernels` by name (the harness reads each one's cubin: registers, spills)."""

    def __init__(self, kernels: dict):
        self.kernels = kernels


def compile_decode(h_q: int, arch: str) -> CompiledDecode:
    """gather, attention and combine, compiled with fake tensors (no GPU needed)."""
    return CompiledDecode({"gather": compile_kernel(DequantGather(), *gather_fake_args(), arch=arch),
                           "attention": compile_config(attention_config(h_q), arch),
                           "combine": compile_kernel(DecodeCombine(), *combine_fake_args(), arch=arch)})


class Workspace:
    """W, Widx, the partial outputs, the per-row lengths and a no-sink vector of the last shape,
    reused across calls (no allocation in a timed call)."""

    def __init__(self):
        self.key, self.bufs = None, None

    def get(self, b: int, h_q: int, n_split: int, chunk: int, device) -> tuple:
        key = (b, h_q, n_split, chunk, device)
        if self.key != key:
            n_pad = n_split * chunk
            self.bufs = (
                torch.empty(b, n_pad, D, dtype=torch.bfloat16, device=device),
                torch.empty(b, n_pad, dtype=torch.int32, device=device),
                torch.empty(b, n_split, h_q, D, dtype=torch.bfloat16, device=device),
                torch.empty(b, n_split, h_q, dtype=torch.float32, device=device),
                torch.full((b, n_split), chunk, dtype=torch.int32, device=device).t(),  # (rows, b), rows stride 1
                torch.full((h_q,), float("-inf"), device=device),  # the splits' sink: none
            )
            self.key = key
        return self.bufs


def full_lengths(idx: torch.Tensor) -> torch.Tensor:
    return torch.full((idx.shape[0],), idx.shape[1], dtype=torch.int32, device=idx.device)


def run_decode(compiled: CompiledDecode, ws: Workspace, q, caches, indices, lens, sink, out, lse, sms: int) -> None:
    """q bf16 [b, h, 512]; caches: the two FP8 caches [blocks, bs, 1, 584]; indices int32 [b, k_i];
    lens int32 [b] or None per cache; sink fp32 [h] (-inf: none); out bf16 [b, h, 512], lse fp32 [b, h]
    (natural log, sink-free)."""
    gather, attention, combine = (compiled.kernels[k] for k in ("gather", "attention", "combine"))
    b, h_q, _ = q.shape
    n_split, chunk = plan(b, h_q, sum(i.shape[1] for i in indices), sms)
    w, widx, o_part, l_part, row_lens, no_sink = ws.get(b, h_q, n_split, chunk, q.device)
    args = []
    for cache, idx, ln in zip(caches, indices, lens):
        args += [*cache_views(cache), idx, full_lengths(idx) if ln is None else ln]
    gather(*args, w, widx)
    split = n_split > 1
    o_dst = o_part if split else out[:, None]
    l_dst = l_part if split else lse[:, None]
    attention(
        q[:, None].expand(b, n_split, h_q, D).permute(1, 2, 3, 0),  # rows: stride 0
        w[:, :, None].permute(1, 2, 3, 0), w[:, :, None].permute(1, 2, 3, 0),
        widx.view(b, n_split, chunk).permute(1, 2, 0), row_lens,
        no_sink if split else sink,
        o_dst.permute(1, 2, 3, 0), l_dst.permute(1, 2, 0),
        D ** -0.5 * LOG2E, 0, NO_WINDOW, sms,
    )
    if split:
        combine(o_part, l_part, sink, out, lse)


# ---------------------------------------------------------------- v2: the fused kernel (decode_fused.py)
def compile_fused(h_q: int, arch: str, kernel_class: type) -> CompiledDecode:
    """The fused attention kernel (a decode_fused.FusedDecodeSm90 form: FP8 gather + dequantisation in its
    producer) and the combine."""
    from kernels.fmha.decode_fused import fake_args as fused_fake_args

    return CompiledDecode({"fused": compile_kernel(kernel_class(attention_config(h_q)), *fused_fake_args(), arch=arch),
                           "combine": compile_kernel(DecodeCombine(kernel_class.pdl_combine), *combine_fake_args(),
                                                     arch=arch)})


class FusedWorkspace:
    """The partial outputs, the per-row lengths and a no-sink vector of the last shape (no W)."""

    def __init__(self):
        self.key, self.bufs = None, None
        self.views = Prepared(size=2)  # each cache's (codes, rope, scales) views: ~10 us of Python a call

    def get(self, b: int, h_q: int, n_split: int, chunk: int, device) -> tuple:
        key = (b, h_q, n_split, chunk, device)
        if self.key != key:
            self.bufs = (
                torch.empty(b, n_split, h_q, D, dtype=torch.bfloat16, device=device),
                torch.empty(b, n_split, h_q, dtype=torch.float32, device=device),
                torch.full((b, n_split), chunk, dtype=torch.int32, device=device).t(),  # (rows, b), rows stride 1
                torch.full((h_q,), float("-inf"), device=device),
            )
            self.key = key
        return self.bufs


def fused_slots(k0: int, k1: int) -> int:
    """Slots of a request's list in the fused kernel: cache 0's list padded to whole 64-key tiles
    (each tile reads one cache), then cache 1's (decode_fused.FusedDecodeSm90._k0_padded)."""
    return -(-k0 // 64) * 64 + k1


def fused_tokens(idx: tuple, lens: tuple, tokens: tuple, n_pad: int) -> torch.Tensor:
    """The token (or -1) the fused kernel reads at each of n_pad slots per request, with the
    kernel's rules (`_copy_slot`, `_valid_token`): a torch model for CPU tests. idx [b, k_i] and
    lens [b] (None: full) per cache, tokens = blocks x block size per cache."""
    k0p = -(-idx[0].shape[1] // 64) * 64
    b = idx[0].shape[0]
    out = torch.full((b, n_pad), -1, dtype=torch.long)
    for c, start in ((0, 0), (1, k0p)):
        k = idx[c].shape[1]
        ln = torch.full((b,), k) if lens[c] is None else lens[c].long().cpu()
        v = idx[c].long().cpu()
        j = torch.arange(k)[None, :]
        ok = (j < ln[:, None]) & (v >= 0) & (v < tokens[c])
        width = max(0, min(k, n_pad - start))
        out[:, start:start + width] = torch.where(ok, v, -1)[:, :width]
    return out


PACKED_MAX_BLOCK, PACKED_MAX_BLOCKS = 1 << PACK_BITS, 1 << (31 - PACK_BITS)  # decode_prefetch's int32 slot


def run_fused(compiled: CompiledDecode, ws: FusedWorkspace, q, caches, indices, lens, sink, out, lse, sms: int,
              split: tuple | None = None) -> None:
    """As run_decode, in one attention launch (+ the combine when split); `split` forces (n_split, chunk)."""
    fused, combine = compiled.kernels["fused"], compiled.kernels["combine"]
    for i, c in enumerate(caches):  # decode_prefetch packs a slot as block << 10 | token in an int32
        if c.shape[1] > PACKED_MAX_BLOCK or c.shape[0] >= PACKED_MAX_BLOCKS:
            raise ValueError(f"cache{i}: the packed-slot decode holds block << 10 | token in an int32: blocks of "
                             f"<= {PACKED_MAX_BLOCK} tokens and < {PACKED_MAX_BLOCKS} blocks, got {tuple(c.shape[:2])}")
    b, h_q, _ = q.shape
    n_split, chunk = split or plan(b, h_q, fused_slots(indices[0].shape[1], indices[1].shape[1]), sms)
    o_part, l_part, row_lens, no_sink = ws.get(b, h_q, n_split, chunk, q.device)
    args = []
    for cache, idx, ln in zip(caches, indices, lens):
        codes, _, scales = ws.views.get((cache,), lambda c=cache: cache_views(c))  # the RoPE is read from the codes row
        args += [codes, scales, idx, full_lengths(idx) if ln is None else ln]
    is_split = n_split > 1
    o_dst = o_part if is_split else out[:, None]
    l_dst = l_part if is_split else lse[:, None]
    fused(q[:, None].expand(b, n_split, h_q, D).permute(1, 2, 3, 0), *args, row_lens,
          no_sink if is_split else sink, o_dst.permute(1, 2, 3, 0), l_dst.permute(1, 2, 0), D ** -0.5 * LOG2E)
    if is_split:
        combine(o_part, l_part, sink, out, lse)
