"""The GEMV decode path's arithmetic in torch (kernels/moe/gemv_sm90.py), in the kernels' order, so the plan
is checked on the CPU against the family's references (tests/moe/test_gemv_cpu.py):

per weight row and 32-wide K chunk (one thread): p = Σ_k (code_k · 2^-126)(x_k · 2^63), k = 0..31 in
order, fp32 (exact products: one FFMA each); q = (p · 2^(e_j − 127)) · (s_x · 2^63); q over the warp's
32 chunks by a butterfly (distances 16, 8, 4, 2, 1), the warps' sums added in warp order; L1: bf16 gate
and up, silu(min(g, 10)) · clamp(u, ±10) · route weight (silu's exp2 is the kernel's ex2.approx, here
exact), bf16 h; L2: h quantised per 128 (dispatch's rule), the same sum, bf16 rows; combine in fp32.
"""

from __future__ import annotations

import torch

from oracles.moe import combine, dispatch_layout, gather_quant
from oracles.quant import E2M1_GRID, fp8_block_quant

SUB, LANES = 32, 32
LIMIT = 10.0
LOG2E = 1.4426950408889634


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """int8/uint8 [N, K/2] (element 2b in the low nibble of byte b) -> fp32 [N, K]."""
    b = codes.view(torch.uint8).to(torch.int64)
    nib = torch.stack([b & 0xF, b >> 4], -1).flatten(-2)
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32)
    v = grid[nib & 7]
    return torch.where(nib >= 8, -v, v)


def gemv_sums(codes: torch.Tensor, scales: torch.Tensor, xv: torch.Tensor, sx: torch.Tensor) -> torch.Tensor:
    """fp32 [N, c]: rows of one expert's MXFP4 weight (codes [N, K/2], e8m0 scales [N, K/32]) against c
    tokens' e4m3 values xv [c, K] with their per-128 scales sx [c, K/128], in the kernel's order."""
    n, k = codes.shape[0], 2 * codes.shape[1]
    w = _e2m1_values(codes).view(n, k // SUB, SUB)  # code values; the kernel's 2^-126 is folded below
    x = (xv.float() * 2.0**-63).view(-1, k // SUB, SUB)  # (x · 2^63) · 2^-126 = x · 2^-63: the same products
    p = torch.zeros(n, k // SUB, x.shape[0], dtype=torch.float32)
    for j in range(SUB):  # one FFMA a code, in order
        p = p + w[:, :, j, None] * x[:, :, j].t()[None]
    e = scales.contiguous().view(torch.uint8).to(torch.int32)  # [N, K/32]
    fw = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 127)
    sxb = sx.float().repeat_interleave(4, -1).t() * 2.0**63  # [K/32, c]
    q = (p * fw[..., None]) * sxb[None]
    warps = k // SUB // LANES
    q = q.view(n, warps, LANES, -1)
    lane = torch.arange(LANES)
    for off in (16, 8, 4, 2, 1):
        q = q + q[:, :, lane ^ off]
    q = q[:, :, 0]  # [N, W, c]
    out = q[:, 0]
    for wi in range(1, warps):
        out = out + q[:, wi]
    return out


def _silu_swiglu(g: torch.Tensor, u: torch.Tensor, rw: torch.Tensor) -> torch.Tensor:
    gv = g.bfloat16().float().clamp(max=LIMIT)
    uv = u.bfloat16().float().clamp(-LIMIT, LIMIT)
    silu = gv / (1.0 + torch.exp2(gv * -LOG2E))
    return (silu * uv * rw).bfloat16()


def emulate_layer(x, idx, weights, shared, experts, n_experts: int, max_m: int) -> torch.Tensor:
    """bf16 [T, D]: the layer as dispatch -> GEMV L1 -> GEMV L2 -> combine compute it; experts =
    (w1, s1, w3, s3, w2, s2) (the checkpoint's buffers)."""
    w1, s1, w3, s3, w2, s2 = experts
    lay = dispatch_layout(idx, weights, n_experts, n_experts * max_m, max_m)
    codes, scales = gather_quant(x, lay["src"], n_experts)  # scales [E, D/128, max_m]
    t_all, d = x.shape
    rows = torch.full((n_experts * max_m, d), 0.0, dtype=torch.bfloat16)
    for e in range(n_experts):
        c = min(int(lay["counts"][e]), max_m)
        if c == 0:
            continue
        r = slice(e * max_m, e * max_m + c)
        xv = codes[r].view(torch.float8_e4m3fn).float()
        sx = scales[e, :, :c].t()  # [c, D/128]
        g = gemv_sums(w1[e], s1[e], xv, sx)  # [I, c]
        u = gemv_sums(w3[e], s3[e], xv, sx)
        h = _silu_swiglu(g, u, lay["row_weight"][r][None]).t()  # [c, I] bf16
        hq, hs = fp8_block_quant(h, 128)
        y = gemv_sums(w2[e], s2[e], hq.float(), hs)  # [D, c]
        rows[r] = y.t().bfloat16()
    return (combine(rows, lay["pos"], shared)).bfloat16()
