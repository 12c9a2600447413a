"""Glue of the moe kernels: fake tensors and compiles, argument checks (ValueError naming the argument),
and the calls `dispatch` / `combine` for model code and the family.

Buffers of a dispatch (R = layout rows: `oracles.moe.contiguous_rows(T, k, E)` for the contiguous
layout, E * max_m for the masked one):
    counts int32 [E], pos int32 [T, k], src / expert int32 [R], row_weight fp32 [R],
    codes uint8 [R, D] (e4m3 bits; view as torch.float8_e4m3fn for a GEMM),
    scales fp32 [D/128, R] (contiguous) or [E, D/128, max_m] (masked), MN-major.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

from kernels.common import compile_kernel
from kernels.moe.combine import CombineKernel
from kernels.moe.dispatch import QBLOCK, Dispatch
from kernels.moe.dispatch_fused import FusedMaskedDispatch
from oracles.moe import TILE_M, contiguous_rows

OUTPUTS = ("counts", "pos", "src", "expert", "row_weight", "codes", "scales")


def _flat(dtype, n, align=4):
    return make_fake_compact_tensor(dtype, (n,), stride_order=(0,), assumed_align=align)


def _rowmajor(dtype, shape, align=16):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                    assumed_align=align)


def compile_dispatch(n_experts: int, topk: int, d: int, layout: str, arch: str = "sm_90a", skip_padding: bool = False,
                     pdl: bool = False, fused: bool = False, early_x: bool = False):
    """One compile per (E, k, D, layout); tokens and layout rows are runtime sizes. skip_padding: the padding
    rows' codes and scales are left unwritten (the layer's masked layout; the dispatch op writes them). fused: the
    masked skip_padding dispatch in one launch (kernels/moe/dispatch_fused.py; padding rows' side data unwritten);
    early_x: its row groups load x before ranking themselves (FusedMaskedDispatch; v29, the layer's since session
    49)."""
    if fused and not (skip_padding and layout == "masked"):
        raise ValueError("fused is the layer's masked dispatch (layout='masked', skip_padding=True) only")
    if early_x and not fused:
        raise ValueError("early_x is a mode of the fused dispatch")
    t, n, rows = cute.sym_int(), cute.sym_int(), cute.sym_int()
    groups = 1 if layout == "contiguous" else n_experts
    x = make_fake_tensor(cutlass.BFloat16, (t, d), (d, 1), assumed_align=16)
    scales = _rowmajor(cutlass.Float32, (groups, d // QBLOCK, cute.sym_int()), align=4)
    args = (x, _flat(cutlass.Int32, n), _flat(cutlass.Float32, n), _flat(cutlass.Int32, n_experts),
            _flat(cutlass.Int32, n), _flat(cutlass.Int32, rows), _flat(cutlass.Int32, rows),
            _flat(cutlass.Float32, rows), make_fake_tensor(cutlass.Uint8, (rows, d), (d, 1), assumed_align=16), scales)
    call = FusedMaskedDispatch(n_experts, topk, d, pdl, early_x) if fused else \
        Dispatch(n_experts, topk, d, layout, TILE_M, skip_padding, pdl)
    return compile_kernel(call, *args, arch=arch)


def compile_combine(d: int, topk: int, arch: str = "sm_90a", pdl: bool = False, early: bool = False):
    t, rows = cute.sym_int(), cute.sym_int()
    return compile_kernel(CombineKernel(d, topk, pdl, early), _rowmajor(cutlass.BFloat16, (rows, d)),
                          _rowmajor(cutlass.Int32, (t, topk), align=4), _rowmajor(cutlass.BFloat16, (t, d)),
                          _rowmajor(cutlass.BFloat16, (t, d)), arch=arch)


def layout_size(tokens: int, topk: int, n_experts: int, max_m: int | None) -> int:
    """Rows of a layout: E * max_m (masked) or the contiguous bound."""
    return n_experts * max_m if max_m is not None else contiguous_rows(tokens, topk, n_experts, TILE_M)


def alloc_dispatch(tokens: int, topk: int, n_experts: int, d: int, max_m: int | None, device) -> dict:
    rows = layout_size(tokens, topk, n_experts, max_m)
    i32 = dict(dtype=torch.int32, device=device)
    scales = (d // QBLOCK, rows) if max_m is None else (n_experts, d // QBLOCK, max_m)
    return {"counts": torch.empty(n_experts, **i32), "pos": torch.empty(tokens, topk, **i32),
            "src": torch.empty(rows, **i32), "expert": torch.empty(rows, **i32),
            "row_weight": torch.empty(rows, dtype=torch.float32, device=device),
            "codes": torch.empty(rows, d, dtype=torch.uint8, device=device),
            "scales": torch.empty(scales, dtype=torch.float32, device=device)}


def planned(cache: dict, make, tokens: int, topk: int, n_experts: int, d: int, i: int, max_m: int | None,
            device) -> dict:
    """A layer's intermediate buffers `make(lay)` builds around its dispatch layout (alloc_dispatch), made
    once per (shape, device, stream) and reused while the calls keep that key (stream order makes the
    reuse safe; allocating them and rebuilding every view in each call is host time the GPU waits for
    at decode). `cache` keeps only the last key, so a sweep over shapes does not pile them up."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (tokens, topk, n_experts, d, i, max_m, str(device), stream)
    plan = cache.get(key)
    if plan is None:
        cache.clear()
        plan = cache[key] = make(alloc_dispatch(tokens, topk, n_experts, d, max_m, device))
    return plan


def dispatch_args(lay: dict, max_m: int | None) -> tuple:
    """The dispatch kernel's outputs as its call takes them (the contiguous layout's scales get a
    leading group mode)."""
    return (lay["counts"], lay["pos"].view(-1), lay["src"], lay["expert"], lay["row_weight"], lay["codes"],
            lay["scales"] if max_m is not None else lay["scales"].unsqueeze(0))


def check_dispatch(x, idx, weights, out: dict, n_experts: int, max_m: int | None, outputs: bool = True) -> None:
    """ValueError naming the first argument that does not fit the compiled dispatch (`outputs` False: the
    inputs only, for callers that allocated `out` with alloc_dispatch themselves)."""
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] % QBLOCK or not x.is_contiguous():
        raise ValueError(f"x must be contiguous bf16 [T, D] with D % {QBLOCK} == 0, got {x.dtype} {tuple(x.shape)}")
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != x.shape[0] or not idx.is_contiguous():
        raise ValueError(f"idx must be contiguous int32 [T, k] with T = {x.shape[0]}, got {idx.dtype} {tuple(idx.shape)}")
    if weights.dtype != torch.float32 or weights.shape != idx.shape or not weights.is_contiguous():
        raise ValueError(f"weights must be contiguous fp32 {tuple(idx.shape)}, got {weights.dtype} {tuple(weights.shape)}")
    if not outputs:
        return
    want = alloc_dispatch(x.shape[0], idx.shape[1], n_experts, x.shape[1], max_m, "meta")
    for name in OUTPUTS:
        got = out[name]
        if got.dtype != want[name].dtype or got.shape != want[name].shape or not got.is_contiguous():
            raise ValueError(f"out[{name!r}] must be contiguous {want[name].dtype} {tuple(want[name].shape)}, "
                             f"got {got.dtype} {tuple(got.shape)}")


def run_dispatch(compiled, x, idx, weights, out: dict, n_experts: int, max_m: int | None,
                 check_outputs: bool = True) -> dict:
    check_dispatch(x, idx, weights, out, n_experts, max_m, check_outputs)
    scales = out["scales"] if max_m is not None else out["scales"].unsqueeze(0)
    compiled(x, idx.view(-1), weights.view(-1), out["counts"], out["pos"].view(-1), out["src"], out["expert"],
             out["row_weight"], out["codes"], scales)
    return out


def check_fits(counts: torch.Tensor, max_m: int) -> None:
    """The masked layout's contract (a host sync): every expert's count fits max_m."""
    worst = int(counts.max())
    if worst > max_m:
        raise ValueError(f"max_m={max_m} is too small: an expert received {worst} entries "
                         f"(entries past max_m were dropped; use max_m >= {worst})")


def check_combine(rows, pos, shared, y) -> None:
    if rows.dtype != torch.bfloat16 or rows.dim() != 2 or not rows.is_contiguous():
        raise ValueError(f"rows must be contiguous bf16 [R, D], got {rows.dtype} {tuple(rows.shape)}")
    t, d = shared.shape[0], rows.shape[1]
    if pos.dtype != torch.int32 or pos.dim() != 2 or pos.shape[0] != t or not pos.is_contiguous():
        raise ValueError(f"pos must be contiguous int32 [T, k] with T = {t}, got {pos.dtype} {tuple(pos.shape)}")
    for name, v in (("shared", shared), ("y", y)):
        if v.dtype != torch.bfloat16 or v.shape != (t, d) or not v.is_contiguous():
            raise ValueError(f"{name} must be contiguous bf16 [{t}, {d}], got {v.dtype} {tuple(v.shape)}")


def run_combine(compiled, rows, pos, shared, y):
    check_combine(rows, pos, shared, y)
    compiled(rows, pos, shared, y)
    return y


_COMPILED: dict = {}


def _cached(key, make):
    if key not in _COMPILED:
        _COMPILED[key] = make()
    return _COMPILED[key]


def dispatch(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, n_experts: int,
             max_m: int | None = None) -> dict:
    """The op for model code: the router's output -> the contiguous (max_m None) or masked layout with
    x gathered and FP8-quantised (the buffers of the module docstring). A masked count past max_m
    raises a ValueError (after the call: it reads the counts back)."""
    layout = "contiguous" if max_m is None else "masked"
    compiled = _cached(("dispatch", n_experts, idx.shape[1], x.shape[1], layout),
                       lambda: compile_dispatch(n_experts, idx.shape[1], x.shape[1], layout))
    out = alloc_dispatch(x.shape[0], idx.shape[1], n_experts, x.shape[1], max_m, x.device)
    run_dispatch(compiled, x, idx, weights, out, n_experts, max_m)
    if max_m is not None:
        check_fits(out["counts"], max_m)
    return out


def combine(rows: torch.Tensor, pos: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """The op for model code: y = bf16(Σ_j rows[pos[:, j]] + shared), bf16 [T, D]."""
    compiled = _cached(("combine", rows.shape[1], pos.shape[1]), lambda: compile_combine(rows.shape[1], pos.shape[1]))
    return run_combine(compiled, rows, pos, shared, torch.empty_like(shared))
