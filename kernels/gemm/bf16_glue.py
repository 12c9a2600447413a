"""Glue of the bf16 GEMM (kernels/gemm/bf16_sm90.py): fake tensors for the CPU compile, argument
checks, the call, and the operands / oracle of its sweep cases and tests."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import compile_kernel, sm_count
from kernels.gemm.bf16_config import Bf16Config, choose_bf16_config
from kernels.gemm.bf16_sm90 import Bf16GemmSm90
from kernels.gemm.glue import workspace

K_ALIGN = 8  # TMA: 16-byte row strides of x and W
OUT_DTYPES = {torch.float32: cutlass.Float32, torch.bfloat16: cutlass.BFloat16}


def fake_args(cfg: Bf16Config, out_dtype: torch.dtype = torch.float32) -> tuple:
    """x (M, K) bf16, w (N, K) bf16, y (M, N) of `out_dtype`, the split-K workspace and counters,
    n_ctas; every size a runtime value."""
    m, n, k, ws, nt = (cute.sym_int32() for _ in range(5))
    bf16 = cutlass.BFloat16
    x = make_fake_tensor(bf16, (m, k), (cute.sym_int64(divisibility=K_ALIGN), 1), assumed_align=16)
    w = make_fake_tensor(bf16, (n, k), (cute.sym_int64(divisibility=K_ALIGN), 1), assumed_align=16)
    y = make_fake_tensor(OUT_DTYPES[out_dtype], (m, n), (cute.sym_int64(), 1), assumed_align=4)
    work = make_fake_tensor(cutlass.Float32, (ws,), (1,), assumed_align=16)
    count = make_fake_tensor(cutlass.Int32, (nt,), (1,), assumed_align=4)
    return x, w, y, work, count, cutlass.Int32(132)


def compile_bf16_gemm(cfg: Bf16Config, out_dtype: torch.dtype = torch.float32, arch: str = "sm_90a"):
    """Compile one tile configuration for one output dtype (no GPU needed)."""
    return compile_kernel(Bf16GemmSm90(cfg), *fake_args(cfg, out_dtype), arch=arch)


def check_bf16_operands(x, w, out=None) -> tuple[int, int, int]:
    """Validate x bf16 [M, K], w bf16 [N, K] (contiguous, 16-byte aligned, K a positive multiple of 8)
    and out fp32 or bf16 [M, N] (rows contiguous); ValueError naming the offending tensor. (M, N, K)."""
    def need(ok: bool, name: str, what: str):
        if not ok:
            raise ValueError(f"gemm bf16: {name} {what}")

    for name, t in (("x", x), ("w", w)):
        need(isinstance(t, torch.Tensor) and t.dim() == 2, name, "must be a 2-D tensor")
        need(t.dtype == torch.bfloat16, name, f"must be bfloat16, got {t.dtype}")
        need(t.is_contiguous(), name, f"must be contiguous (K-major), got strides {tuple(t.stride())}")
        need(t.data_ptr() % 16 == 0, name, "must be 16-byte aligned (a TMA operand)")
    m, k = x.shape
    n, kw = w.shape
    need(kw == k, "w", f"has K = {kw}, x has K = {k}")
    need(k > 0 and k % K_ALIGN == 0, "w", f"K = {k} is not a positive multiple of {K_ALIGN} (16-byte TMA rows)")
    need(m > 0, "x", "has M = 0")
    need(n > 0, "w", "has N = 0")
    if out is not None:
        need(isinstance(out, torch.Tensor) and out.dtype in OUT_DTYPES, "out",
             f"must be float32 or bfloat16, got {getattr(out, 'dtype', type(out))}")
        need(tuple(out.shape) == (m, n), "out", f"must have shape {(m, n)}, got {tuple(out.shape)}")
        need(out.stride(1) == 1, "out", f"must have contiguous rows, got strides {tuple(out.stride())}")
    devs = {t.device for t in (x, w) + ((out,) if out is not None else ())}
    need(len(devs) == 1, "x", f"and the other operands must be on one device, got {sorted(map(str, devs))}")
    return m, n, k


def run_bf16_gemm(compiled, cfg: Bf16Config, x, w, out, n_ctas: int | None = None) -> torch.Tensor:
    m, n = x.shape[0], w.shape[0]
    work, count = workspace(cfg, m, n, x.device)
    compiled(x, w, out, work, count, n_ctas or sm_count(x.device))
    return out


_COMPILED: dict = {}


def bf16_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
              out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The op for code outside the harness: y = x . W^T, bf16 operands, fp32 accumulation, `out_dtype`
    (or out's) output. Compiled kernels are cached per (tile configuration, output dtype)."""
    if out is not None:
        out_dtype = out.dtype
    m, n, k = check_bf16_operands(x, w, out)
    cfg = choose_bf16_config(m, n, k)
    key = (cfg, out_dtype)
    if key not in _COMPILED:
        _COMPILED[key] = compile_bf16_gemm(cfg, out_dtype)
    out = torch.empty(m, n, dtype=out_dtype, device=x.device) if out is None else out
    return run_bf16_gemm(_COMPILED[key], cfg, x, w, out)


def draw_bf16_operands(m: int, n: int, k: int, seed: int, device: str = "cpu"):
    """Random bf16 x [m, k] (rows of different magnitudes) and W [n, k] (checkpoint-like 0.02 scale),
    drawn on `device` (the 1-2 GB heads are drawn where they run)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device)
    x *= torch.exp2(torch.randint(-3, 4, (m, 1), generator=gen, device=device).float())
    w = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
    return x.bfloat16(), w


def bf16_oracle(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """FP32 truth: x.float() @ W.float().T (the reference's own math on these operands)."""
    return x.float() @ w.float().T
