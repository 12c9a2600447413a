"""Glue of the bf16 GEMM (kernels/gemm/bf16_sm90.py): fake tensors for the CPU compile, argument
checks, the call, and the operands / oracle of its sweep cases and tests."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import argument_check, compile_kernel, sm_count
from kernels.gemm.bf16_config import BK, Bf16Config, choose_bf16_config
from kernels.gemm.bf16_sm90 import Bf16GemmSm90
from kernels.gemm.glue import workspace

K_ALIGN = 8  # TMA: 16-byte row strides of x and W
GROUP_N_ALIGN = 64  # grouped: a group's output columns are whole N tiles (bn 64 at the least)
OUT_DTYPES = {torch.float32: cutlass.Float32, torch.bfloat16: cutlass.BFloat16}


def fake_args(cfg: Bf16Config, out_dtype: torch.dtype = torch.float32) -> tuple:
    """x (M, K) bf16, w (N, K) bf16, y (M, N) of `out_dtype`, the split-K workspace and counters,
    n_ctas; every size a runtime value."""
    m, n, k, ws, nt = (cute.sym_int32() for _ in range(5))
    # grouped, x is [M, G*K] against W's [N, K]: a shared symbol would make the call demand equal K
    k_x = cute.sym_int32() if cfg.group_n else k
    bf16 = cutlass.BFloat16
    x = make_fake_tensor(bf16, (m, k_x), (cute.sym_int64(divisibility=K_ALIGN), 1), assumed_align=16)
    w = make_fake_tensor(bf16, (n, k), (cute.sym_int64(divisibility=K_ALIGN), 1), assumed_align=16)
    y = make_fake_tensor(OUT_DTYPES[out_dtype], (m, n), (cute.sym_int64(), 1), assumed_align=4)
    work = make_fake_tensor(cutlass.Float32, (ws,), (1,), assumed_align=16)
    count = make_fake_tensor(cutlass.Int32, (nt,), (1,), assumed_align=4)
    return x, w, y, work, count, cutlass.Int32(132)


def compile_bf16_gemm(cfg: Bf16Config, out_dtype: torch.dtype = torch.float32, arch: str = "sm_90a"):
    """Compile one tile configuration for one output dtype (no GPU needed)."""
    return compile_kernel(Bf16GemmSm90(cfg), *fake_args(cfg, out_dtype), arch=arch)


def grouped_refusal(n: int, k: int, groups: int) -> str | None:
    """Why a grouped bf16 GEMM of N rows (all groups) and K columns a group cannot run, or None: no x tile
    may reach into the next group's columns, no N tile into the next group's rows."""
    if groups == 1:
        return None
    if k % BK:
        return f"K = {k}: a grouped GEMM needs whole {BK}-column K blocks"
    if n % (groups * GROUP_N_ALIGN):
        return f"N = {n} must be {groups} groups of a multiple of {GROUP_N_ALIGN} rows (whole tiles a group)"
    return None


def check_bf16_operands(x, w, out=None, groups: int = 1) -> tuple[int, int, int]:
    """Validate x bf16 [M, G*K], w bf16 [N, K] (contiguous, 16-byte aligned, K a positive multiple of 8;
    grouped: N / G rows a group, a multiple of GROUP_N_ALIGN, and K a multiple of BK, so that no x
    tile reaches into the next group's columns) and out fp32 or bf16 [M, N] (rows contiguous);
    ValueError naming the offending tensor. (M, N, K of one group)."""
    need = argument_check("gemm bf16")

    for name, t in (("x", x), ("w", w)):
        need(isinstance(t, torch.Tensor) and t.dim() == 2, name, "must be a 2-D tensor")
        need(t.dtype == torch.bfloat16, name, f"must be bfloat16, got {t.dtype}")
        need(t.is_contiguous(), name, f"must be contiguous (K-major), got strides {tuple(t.stride())}")
        need(t.data_ptr() % 16 == 0, name, "must be 16-byte aligned (a TMA operand)")
    need(isinstance(groups, int) and groups >= 1, "groups", f"must be a positive integer, got {groups!r}")
    m, kx = x.shape
    n, k = w.shape
    if groups == 1:
        need(k == kx, "w", f"has K = {k}, x has K = {kx}")
    else:
        need(kx == groups * k, "x", f"has {kx} columns, expected groups x K = {groups} x {k}")
    need(k > 0 and k % K_ALIGN == 0, "w", f"K = {k} is not a positive multiple of {K_ALIGN} (16-byte TMA rows)")
    why = grouped_refusal(n, k, groups)
    need(why is None, "w", why or "")
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
    """out <- x . W^T (grouped when cfg.group_n: out[:, g*Ng:(g+1)*Ng] = x[:, g*K:(g+1)*K] . W_g^T)."""
    m, n = x.shape[0], w.shape[0]
    work, count = workspace(cfg, m, n, x.device)
    compiled(x, w, out, work, count, n_ctas or sm_count(x.device))
    return out


_COMPILED: dict = {}


def bf16_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
              out_dtype: torch.dtype = torch.float32, groups: int = 1) -> torch.Tensor:
    """The op for code outside the harness: y = x . W^T (grouped: x [M, G*K], W [G*Ng, K], each group's
    columns times its rows), bf16 operands, fp32 accumulation, `out_dtype` (or out's) output. Compiled
    kernels are cached per (tile configuration, output dtype)."""
    if out is not None:
        out_dtype = out.dtype
    m, n, k = check_bf16_operands(x, w, out, groups)
    cfg = choose_bf16_config(m, n, k, groups=groups)
    key = (cfg, out_dtype)
    if key not in _COMPILED:
        _COMPILED[key] = compile_bf16_gemm(cfg, out_dtype)
    out = torch.empty(m, n, dtype=out_dtype, device=x.device) if out is None else out
    return run_bf16_gemm(_COMPILED[key], cfg, x, w, out)


def draw_bf16_operands(m: int, n: int, k: int, seed: int, device: str = "cpu", groups: int = 1):
    """Random bf16 x [m, groups * k] (rows of different magnitudes) and W [n, k] (checkpoint-like 0.02
    scale), drawn on `device` (the 1-2 GB heads are drawn where they run)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, groups * k, generator=gen, device=device)
    x *= torch.exp2(torch.randint(-3, 4, (m, 1), generator=gen, device=device).float())
    w = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
    return x.bfloat16(), w


def bf16_oracle(x: torch.Tensor, w: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """FP32 truth: x.float() @ W.float().T (the reference's own math on these operands); grouped, each
    group's x columns times its W rows (the reference's einsum "bsgd,grd->bsgr")."""
    if groups == 1:
        return x.float() @ w.float().T
    xg = x.float().unflatten(1, (groups, -1))
    return torch.einsum("mgk,gnk->mgn", xg, w.float().unflatten(0, (groups, -1))).flatten(1)
