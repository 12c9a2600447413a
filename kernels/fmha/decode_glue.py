"""FP8 sparse decode over FlashMLA's two paged FP8 caches (oracles/fmha_cache.py: the layout), as
three launches:

1. decode_fp8.DequantGather: each request's selected tokens of both caches -> bf16 W [b, n_pad, 512]
   and its index list Widx (j, or -1 where the slot is not read).
2. the gathered-key attention kernel (kernel_sm90.py, unchanged) over W. Split-KV: the request's
   slots are cut into `n_split` chunks that become the kernel's query rows: q has a stride-0 row
   mode (every row is the request's one token), row s's index list is Widx[r, s*chunk:(s+1)*chunk],
   the kv batch entry r is W[r]. Grid = n_split x head blocks x requests.
3. decode_combine.DecodeCombine (n_split > 1 only): the log-sum-exp merge and the sink. With one
   split the attention kernel applies the sink and writes the outputs directly.

The split count (`plan`): CTAs = n_split x (h_q / 64) x b, chunks of whole 128-key pairs (the
key-split consumers take tiles in pairs), the count that minimises a wave model of the kernel.
"""

from __future__ import annotations

import torch

from kernels.common import compile_kernel
from kernels.fmha.config import LOG2E, Config
from kernels.fmha.decode_combine import DecodeCombine
from kernels.fmha.decode_combine import fake_args as combine_fake_args
from kernels.fmha.decode_fp8 import DequantGather
from kernels.fmha.decode_fp8 import fake_args as gather_fake_args
from kernels.fmha.glue import NO_WINDOW, compile_config
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
