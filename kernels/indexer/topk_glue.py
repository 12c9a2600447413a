"""Glue of the indexer top-k kernel (kernels/indexer/topk_sm90.py): fake tensors for the CPU compile,
argument checks, the output width, the call, and the model-facing op `topk_indices`."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import argument_check, compile_kernel, sm_count
from kernels.indexer.topk_select import CAP, PER_THREAD, VEC
from kernels.indexer.topk_sm90 import IndexerTopkSm90, IndexerTopkSplitSm90

TOPK = {"flash": 512, "pro": 1024}  # DSV4 index_topk
MAX_ENTRIES = 1 << 18  # 262,144 entries: 1M tokens of context / 4 (the kernel takes any length < 2^31)
SPLIT_MIN = 16384  # entries a split chunk covers at least
MAX_K = 1 << 15  # the gather packs a step's counts in 16 bits (a step is THREADS entries): any k is
# fine for it; this bound only keeps the int32 [T, k] output and the serial gather sane


def fake_args(aligned: bool, split: bool = False) -> tuple:
    """scores (T, S) fp32 with unit column stride, out (T, KK) int32, and for the split form its
    workspace (keys, indices [T, C, CAP], counts [T, C + 1]): all sizes runtime values (shared ones are
    shared symbols, so the TVM-FFI call checks that they agree). `aligned`: rows start on 16 bytes (the
    row stride a multiple of 4 and a 16-byte base), which lets the collect pass load 16-byte vectors."""
    t, s, kk = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    row_stride = cute.sym_int64(divisibility=VEC) if aligned else cute.sym_int64()
    scores = make_fake_tensor(cutlass.Float32, (t, s), (row_stride, 1), assumed_align=16 if aligned else 4)
    out = make_fake_tensor(cutlass.Int32, (t, kk), (cute.sym_int64(), 1), assumed_align=4)
    if not split:
        return scores, out
    c, c1 = cute.sym_int32(), cute.sym_int32()
    buf = [make_fake_tensor(cutlass.Int32, (t, c, CAP), (cute.sym_int64(), CAP, 1), assumed_align=16) for _ in range(2)]
    counts = make_fake_tensor(cutlass.Int32, (t, c1), (cute.sym_int64(), 1), assumed_align=4)
    return scores, out, *buf, counts


def split_chunks(n_rows: int, n: int, sms: int) -> int:
    """CTAs a row for the split form: about one CTA an SM over all rows, each chunk at least
    SPLIT_MIN entries (two collect steps: the sample and the select cost a chunk as much as a few
    steps); 1 (one CTA a row) when the rows alone come near filling the chip. Measured on the H100:
    1 x 262,144 entries best at 16 chunks, 32 x 262,144 at 4, 128 rows at 1."""
    return max(1, min(sms // max(n_rows, 1), -(-n // SPLIT_MIN)))


class CompiledTopk:
    """The compiles of one arch and the dispatch between them: rows of at most CAP entries take the
    direct kernel; longer rows the buffered one — split over several CTAs a row when the rows are too
    few to fill the chip — with 16-byte vector loads when the rows are aligned."""

    def __init__(self, kernels: dict):
        self.kernels = kernels

    def names(self) -> tuple:
        return tuple(self.kernels)

    @staticmethod
    def rows_aligned(scores: torch.Tensor) -> bool:
        return scores.data_ptr() % 16 == 0 and (scores.stride(0) % VEC == 0 or scores.shape[0] <= 1)

    def pick(self, scores: torch.Tensor) -> tuple[str, int]:
        """(kernel name, chunks a row) for these scores."""
        n_rows, n = scores.shape
        if n <= CAP:
            return "direct", 1
        chunks = split_chunks(n_rows, n, sm_count(scores.device))
        form = "split" if chunks > 1 else "rows"
        return f"{form}-{'aligned' if self.rows_aligned(scores) else 'unaligned'}", chunks

    def run(self, name: str, scores: torch.Tensor, out: torch.Tensor, chunks: int = 1):
        kernel = self.kernels[name]
        if not name.startswith("split"):
            kernel(scores, out)
            return
        n_rows = scores.shape[0]
        keys, idx = (torch.empty(n_rows, chunks, CAP, dtype=torch.int32, device=scores.device) for _ in range(2))
        kernel(scores, out, keys, idx, torch.empty(n_rows, chunks + 1, dtype=torch.int32, device=scores.device))

    def __call__(self, scores: torch.Tensor, out: torch.Tensor):
        name, chunks = self.pick(scores)
        self.run(name, scores, out, chunks)


def compile_topk(arch: str = "sm_90a", per_thread: int = PER_THREAD) -> CompiledTopk:
    """Five compiles serve every T, S and k (no GPU needed). No wgmma or TMA: sm_100a compiles too."""
    kernels = {"direct": compile_kernel(IndexerTopkSm90(buffered=False), *fake_args(False), arch=arch)}
    for aligned in (True, False):
        tag = "aligned" if aligned else "unaligned"
        kernels[f"rows-{tag}"] = compile_kernel(IndexerTopkSm90(per_thread=per_thread), *fake_args(aligned), arch=arch)
        kernels[f"split-{tag}"] = compile_kernel(IndexerTopkSplitSm90(per_thread), *fake_args(aligned, True), arch=arch)
    return CompiledTopk(kernels)


def out_width(n_entries: int, k: int) -> int:
    """The oracle's width: min(k, S) (oracles/indexer.py `indexer_topk`)."""
    return min(k, n_entries)


def check_topk_args(logits, k, out=None) -> tuple[int, int, int]:
    """Validate (logits [T, S] float32, unit column stride; k a positive int; out [T, min(k, S)] int32);
    raise ValueError naming the offending argument. Returns (T, S, KK)."""
    need = argument_check("indexer top-k")

    need(isinstance(logits, torch.Tensor), "logits", f"must be a tensor, got {type(logits).__name__}")
    need(logits.dim() == 2, "logits", f"must be 2-D [T, S], got shape {tuple(logits.shape)}")
    need(logits.dtype == torch.float32, "logits", f"must be float32, got {logits.dtype}")
    n_tok, n = logits.shape
    need(logits.stride(1) == 1 or n <= 1, "logits", f"rows must be contiguous, got strides {tuple(logits.stride())}")
    need(n < 2**31 and n_tok < 2**31, "logits", f"has too many entries: shape {tuple(logits.shape)}")
    return n_tok, n, check_k_out(n_tok, n, k, out, logits.device, "indexer top-k")


def check_k_out(n_tok: int, n: int, k, out, device, op: str) -> int:
    """k (a positive int) and out (None, or int32 [T, min(k, S)] with contiguous rows on `device`) of a
    top-k over T rows of S entries; ValueError naming the argument. Returns KK = min(k, S)."""
    need = argument_check(op)

    need(isinstance(k, int) and not isinstance(k, bool), "k", f"must be an int, got {type(k).__name__}")
    need(0 < k <= MAX_K, "k", f"must be in 1..{MAX_K}, got {k}")
    kk = out_width(n, k)
    if out is not None:
        need(isinstance(out, torch.Tensor) and out.dtype == torch.int32, "out",
             f"must be an int32 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
        need(tuple(out.shape) == (n_tok, kk), "out", f"must have shape {(n_tok, kk)}, got {tuple(out.shape)}")
        need(out.stride(1) == 1 or kk <= 1, "out", f"rows must be contiguous, got strides {tuple(out.stride())}")
        need(out.device == device, "out", f"must be on {device}, got {out.device}")
    return kk


def run_topk(compiled, logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[T, KK] <- the indices (every element written)."""
    if out.numel() == 0:
        return out
    compiled(logits, out)
    return out


_COMPILED: dict = {}


def topk_indices(logits: torch.Tensor, k: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The op for model code: int32 [T, min(k, S)] indices of each row's k largest valid (not -inf)
    logits, ascending index order, ties to the lower index, -1 in the slots past the valid count
    (the set of oracles/indexer.py `indexer_topk`). Bad input -> ValueError naming the argument."""
    n_tok, n, kk = check_topk_args(logits, k, out)
    if logits.device.type != "cuda":
        raise ValueError(f"indexer top-k: logits must be on a CUDA device, got {logits.device}")
    if out is None:
        out = torch.empty(n_tok, kk, dtype=torch.int32, device=logits.device)
    if "sm_90a" not in _COMPILED:
        _COMPILED["sm_90a"] = compile_topk("sm_90a")
    return run_topk(_COMPILED["sm_90a"], logits, out)
