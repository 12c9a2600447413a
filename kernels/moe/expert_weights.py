"""Load-time side data of the grouped expert GEMM (kernels/moe/grouped_sm90.py): made once per weight,
never per call. Pure torch (runs on the CPU in tests, on the device at load).

The kernel reads the checkpoint's MXFP4 codes (e2m1, two per byte) from HBM and widens them to FP8 e4m3
in shared memory. A weight element is c · 2^(e_j − 127) (c in {0, .5, 1, 1.5, 2, 3, 4, 6}, e_j the ue8m0
byte of its 32-wide sub-block j). Per (weight row n, 128-wide K block) with m = max of the 4 sub-block
exponents, take the reference exponent r = m − 6 and write

    w = [c · 2^(e_j − r)] · 2^(r − 127)

The bracket is what the kernel widens to e4m3 (`shift` s_j = e_j − r <= 6: at most 6 · 2^6 = 384 <=
448); 2^(r − 127) is a per-(n, K block) fp32 factor applied in the per-128-K promotion with the
activation's per-row scale (`col_scale`). The bracket is exact in e4m3 while s_j >= −8, i.e. while the
block's exponents span <= 14 binades: the smallest nonzero value 0.5 · 2^(s_j) must be a multiple of
the e4m3 subnormal step 2^-9 (1.5 · 2^s needs the same). A sub-block below that (s_j < −8) is widened
by round-to-nearest-even onto the e4m3 grid: values under 2^-10 · 2^(r − 127) flush to zero, others
round to the subnormal step 2^-9: the error per element is at most half a step, 2^-10 · 2^(r − 127),
i.e. 2^-19 of the block's largest weight (384 · 2^(r − 127) or more): bounded, tested, never silent
(`flush_stats` counts such sub-blocks; the synthetic weights span 3 binades). A shift is stored as the byte offset of
its 8-byte pair in `widen_table`, PAIR_BYTES · (s + SHIFT_BIAS) with s + SHIFT_BIAS clamped to [0, SHIFTS) (s <= −13
flushes every code to zero anyway): the kernel adds the byte to the table's address as it is, no scaling op.

Layouts (E experts, N weight rows, K reduction, KB = K / 128):
    codes      uint8 [E, N, K/2]        the checkpoint's bytes (element 2k in the low nibble)
    shift      uint8 [E, KB, N, 4]      table pair offset of each 32-wide sub-block (the kernel reads int32 words)
    col_scale  fp32  [E, KB, N]         2^(r − 127) (MN-major: a tile's bn values are one TMA box)
Layer 1's w1 (gate) and w3 (up) become one weight of 2I rows interleaved in groups of 8 (`interleave`):
row 16q + x is gate row 8q + x, row 16q + 8 + x up row 8q + x (x < 8): in the SM90 accumulator a thread
holds columns c and c + 8, so gate and up of one intermediate meet in one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.moe.grouped_config import BN
from oracles.quant import E2M1_GRID, UE8M0_BIAS, unpack_fp4

SUB = 32  # MXFP4 block along K
KBLOCK = 128  # the promotion block along K
MAX_SHIFT = 6  # 6 · 2^6 = 384 <= 448 (e4m3 max)
SHIFT_BIAS = 13  # table index = shift + 13: shift −13 and below flush every code to 0
SHIFTS = SHIFT_BIAS + MAX_SHIFT + 1  # 20 tables of 8 e4m3 bytes
PAIR_BYTES = 8  # a table's bytes: a shift byte is PAIR_BYTES x its table index (<= 152)
EXACT_SPAN = 14  # binades of exponent span within a (row, 128-K block) that widen exactly
INTERLEAVE = 8


@dataclass(frozen=True)
class GroupedWeight:
    """One grouped-GEMM weight of E experts, as the kernel reads it."""

    codes: torch.Tensor  # uint8 [E, N, K/2] (order "plain"), or v5's RS-ordered tiles [E, NT, KB, BN, 64] ("rs")
    shift: torch.Tensor  # uint8 [E, KB, N, 4]: byte offsets of the sub-blocks' widen_table pairs
    col_scale: torch.Tensor  # fp32 [E, KB, N]
    frame: str = "block"  # the reference exponent per (row, K block), or per row ("row": v3's row_frame kernels)
    order: str = "plain"  # the codes' layout: the checkpoint's rows, or `rs_tiles` (all a model's GEMMs read, v8)

    @property
    def shape(self) -> tuple[int, int, int]:
        e, kb, n, _ = self.shift.shape
        return e, n, kb * KBLOCK


def widen_table(device="cpu") -> torch.Tensor:
    """int32 [SHIFTS, 2]: for table index s + SHIFT_BIAS (at byte PAIR_BYTES · (s + SHIFT_BIAS)), the e4m3 bytes of
    E2M1_GRID[i] · 2^s, i = 0..7, byte i of the 8-byte little-endian pair (the kernel's `prmt` table). RNE onto the
    e4m3 grid."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32)
    shifts = torch.arange(SHIFTS, dtype=torch.float32) - SHIFT_BIAS
    vals = grid[None, :] * torch.exp2(shifts)[:, None]
    table = vals.to(torch.float8_e4m3fn).view(torch.uint8).contiguous()
    return table.view(torch.int32).view(SHIFTS, 2).to(device)


def _exponents(scales: torch.Tensor) -> torch.Tensor:
    exps = scales.contiguous().view(torch.uint8).to(torch.int32)
    if bool((exps == 255).any()):
        raise ValueError("an MXFP4 scale is NaN (e8m0 byte 255): refusing the weight")
    return exps


FRAMES = ("block", "row")


def prepare(codes: torch.Tensor, scales: torch.Tensor, frame: str = "block") -> GroupedWeight:
    """codes int8/uint8 [E, N, K/2], ue8m0 scales (float8_e8m0fnu or uint8) [E, N, K/32] -> GroupedWeight.

    frame "block" (v2): the reference exponent r per (row n, 128-K block). frame "row" (v3's `row_frame`
    kernel, kernels/moe/grouped_split.py): one r per row n, the max over the whole row's sub-blocks − 6, so
    col_scale is the same in every K block and the kernel applies it once, after the last K block (the
    per-K-block promotion is then one FFMA an element instead of an FMUL and an FFMA). The same bracket and
    table; exact while a row's exponents span <= 14 binades (`flush_stats(scales, "row")`), bounded beyond."""
    e, n, half = codes.shape
    k = 2 * half
    if k % KBLOCK or scales.shape != (e, n, k // SUB):
        raise ValueError(f"K={k} must be a multiple of {KBLOCK} and scales [E, N, K/32], got {tuple(scales.shape)}")
    if frame not in FRAMES:
        raise ValueError(f"frame must be one of {FRAMES}, got {frame!r}")
    exps = _exponents(scales).view(e, n, k // KBLOCK, KBLOCK // SUB)
    if frame == "row":
        ref = exps.amax(-1).amax(-1, keepdim=True).expand(e, n, k // KBLOCK) - MAX_SHIFT  # [E, N, KB], equal along KB
    else:
        ref = exps.amax(-1) - MAX_SHIFT  # r = m − 6, [E, N, KB]
    shift = (exps - ref[..., None] + SHIFT_BIAS).clamp(min=0) * PAIR_BYTES
    col_scale = torch.ldexp(torch.ones_like(ref, dtype=torch.float32), (ref - UE8M0_BIAS).float())
    return GroupedWeight(codes.contiguous().view(torch.uint8), shift.to(torch.uint8).transpose(1, 2).contiguous(),
                         col_scale.transpose(1, 2).contiguous(), frame)


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows of a (gate) and b (up), [E, I, ...] each -> [E, 2I, ...] in groups of INTERLEAVE rows."""
    e, i = a.shape[:2]
    if i % INTERLEAVE:
        raise ValueError(f"I={i} must be a multiple of {INTERLEAVE}")
    pair = torch.stack([a.reshape(e, i // INTERLEAVE, INTERLEAVE, *a.shape[2:]),
                        b.reshape(e, i // INTERLEAVE, INTERLEAVE, *b.shape[2:])], 2)
    return pair.reshape(e, 2 * i, *a.shape[2:])


def prepare_layer(w1, s1, w3, s3, w2, s2, frame: str = "block") -> tuple[GroupedWeight, GroupedWeight]:
    """The checkpoint's w1/w3/w2 (and scales) of E experts -> (L1 weight with gate/up interleaved, L2 weight)."""
    return prepare(interleave(w1, w3), interleave(s1, s3), frame), prepare(w2, s2, frame)


# ---------------------------------------------------------------- the kernel's widening, in torch

def widened_codes(w: GroupedWeight) -> torch.Tensor:
    """The e4m3 tile the kernel builds in shared memory: float8_e4m3fn [E, N, K], byte-for-byte (table
    lookup on the 3-bit magnitude, the sign bit copied)."""
    e, n, k = w.shape
    nib = unpack_fp4(row_codes(w)).to(torch.int64)  # [E, N, K]
    off = w.shift.transpose(1, 2).reshape(e, n, k // SUB).to(torch.int64)  # [E, N, K/32]
    table = widen_table().view(torch.uint8).flatten().to(torch.int64)  # magnitude i of the pair at off: byte off + i
    mag = table[off.repeat_interleave(SUB, -1) + (nib & 7)]
    return (mag | ((nib & 8) << 4)).to(torch.uint8).view(torch.float8_e4m3fn)


def widened_dequant(w: GroupedWeight) -> torch.Tensor:
    """fp32 [E, N, K]: the widened codes times the per-(n, 128-K block) factor: what the kernel multiplies."""
    e, n, k = w.shape
    col = w.col_scale.transpose(1, 2).repeat_interleave(KBLOCK, -1)  # [E, N, K]
    return widened_codes(w).float() * col


def rs_byte_order() -> torch.Tensor:
    """int64 [64]: swap-AB's (v5, kernels/moe/grouped_rs.py) order of a weight row's 64 code bytes of one 128-K
    block: new byte 16q + 4s + t is old byte 16s + 8(t // 2) + 2q + t % 2 (q < 4, s < 4, t < 4). In the RS wgmma's
    A fragment (m64 x k32, e4m3) the thread of quad lane q holds, for k step s, the codes 32s + 4q .. + 3 and
    32s + 16 + 4q .. + 3 of its row: old bytes 16s + 2q, + 1 and 16s + 8 + 2q, + 1. Reordered, the thread's 32
    codes of a row are one 16-byte load, word s the 8 codes of step s (= MXFP4 sub-block s, one table), and
    `widen8_rs` turns word s (in rs_sign_layout) into the fragment's two words of that row (codes 0-3: k 4q..,
    codes 4-7: k 16 + 4q..)."""
    q, s, t = torch.meshgrid(torch.arange(4), torch.arange(4), torch.arange(4), indexing="ij")
    return (16 * s + 8 * (t // 2) + 2 * q + t % 2).reshape(-1)


def code_tiles(codes: torch.Tensor, order: torch.Tensor | None = None, signs: bool = False) -> torch.Tensor:
    """uint8 [E, NT, KB, BN, 64] of codes [E, N, K/2] (N padded with zero rows to NT · BN): the FP4 tile of one
    (expert, n tile, K block) 16 KB contiguous, each row's 64 bytes in `order` if given and each 4-byte word's sign
    bits moved (`signs`: rs_sign_layout); made one expert at a time (a Pro layer's codes are 12.7 GB: no whole-stack
    intermediate)."""
    e, n, half = codes.shape
    nt = -(-n // BN)
    out = torch.empty(e, nt, half // (KBLOCK // 2), BN, KBLOCK // 2, dtype=torch.uint8, device=codes.device)
    for x in range(e):
        c = torch.nn.functional.pad(codes[x], (0, 0, 0, nt * BN - n)) if nt * BN != n else codes[x]
        t = c.view(nt, BN, -1, KBLOCK // 2).permute(0, 2, 1, 3)
        t = t if order is None else t[..., order]
        out[x] = rs_sign_layout(t.contiguous()) if signs else t
    return out


# the RS words' sign bits (rs_sign_layout): nibble n's bit 3 holds the sign of code SIGN_OF[n]
SIGN_OF = (4, 0, 5, 1, 6, 2, 7, 3)


def _move_signs(b: torch.Tensor, src: tuple, dst: tuple) -> torch.Tensor:
    """uint8 [..., 4m] as little-endian 32-bit words: bit 3 of nibble src[i] -> bit 3 of nibble dst[i], magnitudes
    (bits 0-2 of each nibble) kept."""
    w = b.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = w & 0x77777777
    for a, z in zip(src, dst):
        out |= ((w >> (4 * a + 3)) & 1) << (4 * z + 3)
    return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32).view(torch.uint8)


def rs_sign_layout(tiles: torch.Tensor) -> torch.Tensor:
    """RS-ordered code bytes uint8 [..., 64] (a word: 8 e2m1 codes, code n in nibble n) -> the word layout the RS
    readers widen (grouped_widen.widen8_rs): nibble n keeps code n's magnitude in bits 0-2, its bit 3 holds the sign
    of code SIGN_OF[n]. Codes 0-3's signs then sit at bit 7 of their output bytes (bit 8n + 7) and codes 4-7's at
    bit 8(n - 4) + 3, one shift away: the widening moves no sign with `prmt` (7 integer ops for 8 codes, not 9)."""
    return _move_signs(tiles, SIGN_OF, tuple(range(8)))


def rs_tiles(codes: torch.Tensor) -> torch.Tensor:
    """`code_tiles` in the RS byte order (rs_byte_order) and sign layout (rs_sign_layout): what v5 and, since v8,
    v3 / v7 read."""
    return code_tiles(codes, rs_byte_order().to(codes.device), signs=True)


def row_codes(w: GroupedWeight) -> torch.Tensor:
    """w's codes as the checkpoint's rows, uint8 [E, N, K/2] (an "rs" weight's tiles undone: the CPU model's view)."""
    if w.order == "plain":
        return w.codes
    e, n, k = w.shape
    plain = _move_signs(w.codes, tuple(range(8)), SIGN_OF)[..., torch.argsort(rs_byte_order()).to(w.codes.device)]
    return plain.permute(0, 1, 3, 2, 4).reshape(e, -1, k // 2)[:, :n]


def flush_stats(scales: torch.Tensor, frame: str = "block") -> tuple[int, int]:
    """(sub-blocks widened inexactly: more than EXACT_SPAN binades below their block's max (frame "row": their
    row's max), all sub-blocks)."""
    exps = _exponents(scales)
    blocks = exps.view(*exps.shape[:-1], -1, KBLOCK // SUB)
    top = blocks.amax(-1, keepdim=True) if frame == "block" else blocks.amax((-1, -2), keepdim=True)
    inexact = (top - blocks) > EXACT_SPAN
    return int(inexact.sum()), blocks.numel()
