"""The fused decode logits -> top-k path's glue (kernels/indexer/select_sm90.py): the compiles, the
argument checks, the workspace and the launches, and the op `paged_topk`.

Memory: the buffers (2 x B x C x CAP int32, C = the decode kernel's CTAs a request), the sample rows
(B x 2048 fp32) and a logits row per request for the repair ([B, W] fp32, the unfused pair's buffer:
allocated, written only for a request whose bound failed, so no DRAM traffic on the normal path).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import compile_kernel, sm_count
from kernels.indexer import decode_glue
from kernels.indexer import topk_glue
from kernels.indexer.config import choose_parts, fuse_select
from kernels.indexer.decode_glue import cache_views, run_decode
from kernels.indexer.decode_sm90 import PAGE, DecodeConfig
from kernels.indexer.select_sm90 import SAMPLE_PAGES, SELECT_SAMPLE, BoundSm90, CollectSm90, RepairSm90, SampleSm90
from kernels.indexer.topk_select import CAP, LOWEST_VALID, MAX_CHUNKS, fast_path_possible
from kernels.indexer.topk_sm90 import IndexerTopkFinishSm90

STEPS = {"sample": SampleSm90, "collect": CollectSm90, "repair": RepairSm90}


def fake_step_args(cfg: DecodeConfig) -> tuple:
    """The decode kernel's q, codes, scales, w, lens, table (decode_glue.fake_args), then mL (B, X)
    fp32, the buffers (B, C, CAP) int32 and counts (B, C + 1) int32, width, kk, part_pages, n_parts."""
    q, codes, scales, w, lens, table, _out, _p, _n = decode_glue.fake_args(cfg)
    b = w.shape[0]
    rows = make_fake_tensor(cutlass.Float32, (b, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    c, c1 = cute.sym_int32(), cute.sym_int32()
    buf = [make_fake_tensor(cutlass.Int32, (b, c, CAP), (cute.sym_int64(), CAP, 1), assumed_align=16) for _ in range(2)]
    counts = make_fake_tensor(cutlass.Int32, (b, c1), (cute.sym_int64(), 1), assumed_align=4)
    one = cutlass.Int32(1)
    return q, codes, scales, w, lens, table, rows, *buf, counts, one, one, one, one


def fake_bound_args() -> tuple:
    b = cute.sym_int32()
    sample = make_fake_tensor(cutlass.Float32, (b, SELECT_SAMPLE), (cute.sym_int64(), 1), assumed_align=4)
    lens = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4)
    table = make_fake_tensor(cutlass.Int32, (b, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    counts = make_fake_tensor(cutlass.Int32, (b, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    return sample, lens, table, counts, cutlass.Int32(1), cutlass.Int32(1)


@dataclass
class CompiledSelect:
    """The five compiles of one arch, and the unfused pair's two (the path for a KK the buffers
    cannot take)."""

    sample: object
    bound: object
    collect: object
    repair: object
    finish: object
    decode: object
    topk: object

    @property
    def kernels(self) -> dict:
        """Every compiled function by name (what the harness's cubin readers walk:
        dsv4bench/compile/artifacts.py `compiled_functions`)."""
        own = {name: getattr(self, name) for name in ("sample", "bound", "collect", "repair", "finish", "decode")}
        return {**own, **{f"topk-{name}": fn for name, fn in self.topk.kernels.items()}}

    def names(self) -> tuple:
        return tuple(self.kernels)


def compile_select(cfg: DecodeConfig = DecodeConfig(), arch: str = "sm_90a") -> CompiledSelect:
    """Compile the fused path (no GPU needed; SM90 only: the steps are the wgmma decode kernel's)."""
    steps = {name: compile_kernel(cls(cfg), *fake_step_args(cfg), arch=arch) for name, cls in STEPS.items()}
    return CompiledSelect(
        **steps,
        bound=compile_kernel(BoundSm90(), *fake_bound_args(), arch=arch),
        finish=compile_kernel(IndexerTopkFinishSm90(), *topk_glue.fake_args(False, split=True), arch=arch),
        decode=decode_glue.compile_decode(cfg, arch),
        topk=topk_glue.compile_topk(arch),
    )


def check_select(q, kv_cache, w, lens, table, width, k, out=None) -> tuple[int, int]:
    """The paged operands (decode_glue.check_paged_operands), the width W of the logits row a request
    would have, k and out (int32 [B, min(k, W)], contiguous rows); ValueError naming the offending
    argument. Returns (B, KK)."""
    op = "indexer paged top-k"
    if not isinstance(width, int) or isinstance(width, bool) or not 0 <= width < 2**31:
        raise ValueError(f"{op}: width must be an int in 0..2^31-1, got {width!r}")
    n_req = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 3 else -1
    decode_glue.check_paged_operands(q, kv_cache, w, lens, table, n_req, op)
    return n_req, topk_glue.check_k_out(n_req, width, k, out, q.device, op)


def select(compiled: CompiledSelect, q, kv_cache, w, lens, table, width: int, out: torch.Tensor,
           fused: bool | None = None, trace: dict | None = None) -> torch.Tensor:
    """out[B, KK] <- each request's top-KK of its logits row of width W (every element written): the
    five launches of kernels/indexer/select_sm90.py (`fused`: True; None: where config.fuse_select
    says they win), else the unfused pair, which also takes a KK > CAP / 4. The answers are the same.
    `trace` (a dict) receives the fused path's counts workspace (`repaired` reads which requests the
    repair took)."""
    n_req, kk = out.shape
    if n_req == 0 or kk == 0:
        return out
    if fused is None:
        fused = fuse_select(n_req, width)
    if not (fused and fast_path_possible(kk)):
        logits = torch.empty(n_req, width, dtype=torch.float32, device=q.device)
        run_decode(compiled.decode, q, kv_cache, w, lens, table, logits)
        return topk_glue.run_topk(compiled.topk, logits, out)
    part, n_parts, sample_part = plan(n_req, width, sm_count(q.device))
    dev = q.device
    long_rows = width > CAP  # a request may have more keys than the buffers: bound it, repair where that failed
    # one int32 and one fp32 allocation: the two buffers and the counts; the logits rows (the repair's,
    # untouched unless it runs) and the sample rows
    ints = torch.empty(n_req * n_parts * (2 * CAP + 1) + n_req, dtype=torch.int32, device=dev)
    key_buf, idx_buf = ints[:2 * n_req * n_parts * CAP].view(2, n_req, n_parts, CAP).unbind(0)
    counts = ints[2 * n_req * n_parts * CAP:].view(n_req, n_parts + 1)
    floats = torch.empty(n_req * (width + (SELECT_SAMPLE if long_rows else 0)), dtype=torch.float32, device=dev)
    rows = floats[:n_req * width].view(n_req, width)
    codes, scales = cache_views(kv_cache)
    operands = (q.view(n_req * q.shape[1], q.shape[2]), codes, scales, w, lens, table)
    work = (key_buf, idx_buf, counts, width, kk)
    if long_rows:
        sample = floats[n_req * width:].view(n_req, SELECT_SAMPLE)
        compiled.sample(*operands, sample, *work, sample_part, -(-SAMPLE_PAGES // sample_part))
        compiled.bound(sample, lens, table, counts, width, kk)
    compiled.collect(*operands, rows, *work, part, n_parts)
    if long_rows:
        compiled.repair(*operands, rows, *work, part, n_parts)
    compiled.finish(rows, out, key_buf, idx_buf, counts)
    if trace is not None:
        trace["counts"] = counts
    return out


@functools.lru_cache(maxsize=1024)
def plan(n_req: int, width: int, sms: int) -> tuple[int, int, int]:
    """(pages a collect / repair CTA, their CTAs a request (the chunks, at most MAX_CHUNKS), pages a
    sample CTA): the decode kernel's rule (config.choose_parts) for rows of W; the sample's CTAs in one
    wave (two an SM): its parts are short, and a second wave of them was mostly prologue (B = 128:
    23 us for 35 MB with 7 pages a CTA)."""
    pages = -(-width // PAGE)
    part = choose_parts(n_req, pages, sms)
    if -(-pages // part) > MAX_CHUNKS:  # a GPU of more than ~256 SMs: fewer, longer parts
        part = -(-pages // MAX_CHUNKS)
    sample_parts = max(1, min(SAMPLE_PAGES, 2 * sms // n_req))
    return part, -(-pages // part), -(-SAMPLE_PAGES // sample_parts)


def repaired(counts: torch.Tensor, kk: int) -> torch.Tensor:
    """bool [B]: the requests whose buffers did not hold their top-KK (the finish's `buffer_holds`
    on the counts workspace [B, C + 1] after a select), so the repair wrote their logits."""
    total = counts[:, :-1].clamp(max=CAP + 1).sum(1)
    return (total > CAP) | ((total < kk) & (counts[:, -1] != LOWEST_VALID))


_COMPILED: dict = {}


def paged_topk(q, kv_cache, w, lens, table, width: int, k: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The op: DeepGEMM's `fp8_paged_mqa_logits` operands (kernels/indexer/decode_glue.py) -> int32
    [B, min(k, W)], each request's top-k of the logits the decode kernel would write in a row of width
    W (keys s < lens[b], clamped), ascending index order, ties to the lower index, -1 past its valid
    count: the unfused pair's answer exactly; where the fused kernels win (config.fuse_select) without
    the [B, W] logits in DRAM. Bad input -> ValueError naming the argument."""
    n_req, kk = check_select(q, kv_cache, w, lens, table, width, k, out)
    if q.device.type != "cuda":
        raise ValueError(f"indexer paged top-k: the operands must be on a CUDA device, got {q.device}")
    if out is None:
        out = torch.empty(n_req, kk, dtype=torch.int32, device=q.device)
    if "sm_90a" not in _COMPILED:
        _COMPILED["sm_90a"] = compile_select()
    return select(_COMPILED["sm_90a"], q, kv_cache, w, lens, table, width, out)
