"""A torch model of what the grouped expert GEMM (kernels/moe/grouped_sm90.py) computes, step by step:
a sub-block's table pair at the byte offset in its shift word, the `prmt` widening of 4 e2m1 codes (v1) and of 8
(v2), and L1 / L2 on a dispatch layout with the widened weights, the per-128-K promotion (sa[row] · col_scale[n])
and the fused epilogues. The CPU tests check it against the oracles; the GPU tests check the kernel against it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.moe.expert_weights import KBLOCK, GroupedWeight, widened_codes
from oracles.quant import fp8_block_quant

LIMIT = 10.0


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode) on Python ints."""
    pool = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        s = (sel >> (4 * k)) & 0xF
        byte = (pool >> (8 * (s & 7))) & 0xFF
        if s & 8:  # sign-replicate mode (the kernel never sets it)
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def pair_offset(word: int, s: int) -> int:
    """kernels/moe/grouped_widen.pair_offset in Python: byte s of a shift word (its table pair's byte offset)."""
    return prmt(word, 0, 0x4440 + s)


def table_pair(table: bytes, off: int) -> tuple[int, int]:
    """kernels/moe/grouped_widen.table_pair in Python: the two little-endian words at byte `off` of the table."""
    return int.from_bytes(table[off:off + 4], "little"), int.from_bytes(table[off + 4:off + 8], "little")


def widen4(nibbles: int, t0: int, t1: int) -> int:
    """v1's 4-code widening in Python (the reference widen8 is checked against): 4 codes (bits 0-15) -> 4 e4m3
    bytes."""
    mag = prmt(t0, t1, nibbles & 0x7777)
    y = (nibbles | (nibbles << 8)) & 0x00FF00FF
    y = (y | (y << 4)) & 0x0F0F0F0F
    return mag | ((y << 4) & 0x80808080)


def widen8(word: int, t0: int, t1: int) -> tuple[int, int]:
    """kernels/moe/grouped_widen.widen8 in Python: 8 codes (a 32-bit word) -> two words of 4 e4m3 bytes."""
    word &= 0xFFFFFFFF
    mag = word & 0x77777777
    sgn = (word << 4) & 0xFFFFFFFF
    lo = prmt(t0, t1, mag) | (prmt(word, sgn, 0x1504) & 0x80808080)
    hi = prmt(t0, t1, mag >> 16) | (prmt(word, sgn, 0x3726) & 0x80808080)
    return lo, hi


def widen8_rs(word: int, t0: int, t1: int) -> tuple[int, int]:
    """kernels/moe/grouped_widen.widen8_rs in Python: a word in the RS sign layout -> two words of 4 e4m3 bytes."""
    word &= 0xFFFFFFFF
    mag = word & 0x77777777
    return prmt(t0, t1, mag) | (word & 0x80808080), prmt(t0, t1, mag >> 16) | ((word << 4) & 0x80808080)


def _gemm(codes: torch.Tensor, sa: torch.Tensor, w: GroupedWeight, e: int) -> torch.Tensor:
    """fp32 [rows, N] = Σ_kb (codes·Wwidened)_kb · sa[:, kb] · col_scale[kb, :] for expert e's rows."""
    a = codes.view(torch.float8_e4m3fn).float()  # [rows, K]
    b = widened_codes(w)[e].float()  # [N, K]
    kb = a.shape[1] // KBLOCK
    parts = torch.einsum("rbk,nbk->rbn", a.view(-1, kb, KBLOCK), b.view(-1, kb, KBLOCK))
    return (parts * sa[:, :, None] * w.col_scale[e][None]).sum(1)


def rows_of(layout: dict):
    """(expert, rows) of every group of real rows of a dispatch layout."""
    expert = layout["expert"]
    for e in expert[expert >= 0].unique().tolist():
        yield e, torch.nonzero(expert == e).flatten()


def act_scales(scales: torch.Tensor, max_m: int | None) -> torch.Tensor:
    """MN-major layout scales -> [rows, K/128]."""
    if max_m is None:
        return scales.t()
    return scales.transpose(1, 2).reshape(-1, scales.shape[1])


def layer1(layout: dict, codes, scales, w: GroupedWeight, max_m: int | None):
    """(h codes uint8 [rows, I], h scales [rows, I/128]) on the real rows (others zero)."""
    sa = act_scales(scales, max_m)
    rows, i = codes.shape[0], w.shape[1] // 2
    h_codes = torch.zeros(rows, i, dtype=torch.uint8)
    h_scales = torch.zeros(rows, i // KBLOCK)
    for e, r in rows_of(layout):
        acc = _gemm(codes[r], sa[r], w, e).bfloat16().float()  # the reference's bf16 w1 / w3 outputs
        g, u = acc.view(len(r), -1, 2, 8).unbind(2)  # interleaved in groups of 8
        h = F.silu(g.reshape(len(r), i).clamp(max=LIMIT)) * u.reshape(len(r), i).clamp(-LIMIT, LIMIT)
        q, s = fp8_block_quant((h * layout["row_weight"][r, None]).bfloat16(), KBLOCK)
        h_codes[r], h_scales[r] = q.view(torch.uint8), s
    return h_codes, h_scales


def layer2(layout: dict, h_codes, h_scales, w: GroupedWeight) -> torch.Tensor:
    """bf16 [rows, D] on the real rows (others zero)."""
    out = torch.zeros(h_codes.shape[0], w.shape[1], dtype=torch.bfloat16)
    for e, r in rows_of(layout):
        out[r] = _gemm(h_codes[r], h_scales[r], w, e).bfloat16()
    return out


def work_units(group: list[int], mg: int, bm: int, tiles_n: int, masked: bool, max_groups: int = 512,
               m_fastest: bool = False):
    """GroupedWorkList._work / _unit (kernels/moe/grouped_work.py) in Python, step for step: the (group, m tile, n
    tile, expert) of every unit (m_fastest: v5's GroupedRs._unit, masked only)."""
    if masked:
        gt = [(min(c, mg) + bm - 1) // bm for c in group]
        gf = [sum(gt[:g]) for g in range(len(group))]
        n_tiles = gf[-1] + gt[-1]
    else:
        lo, hi = 0, (mg + bm - 1) // bm
        for _ in range(32):
            if lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if group[mid * bm] >= 0 else (lo, mid)
        n_tiles = lo
    units = []
    for u in range(n_tiles * tiles_n):
        nt, t = u % tiles_n, u // tiles_n
        if m_fastest:
            lo, hi = 0, len(group) - 1
            for _ in range(max_groups.bit_length()):
                if lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if gf[mid] * tiles_n <= u else (lo, mid - 1)
            local = u - gf[lo] * tiles_n
            units.append((lo, local % gt[lo], local // gt[lo], lo))
        elif masked:
            lo, hi = 0, len(group) - 1
            for _ in range(max_groups.bit_length()):
                if lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if gf[mid] <= t else (lo, mid - 1)
            units.append((lo, t - gf[lo], nt, lo))
        else:
            units.append((0, t, nt, group[t * bm]))
    return units
