"""Quantisation oracles: FP8 e4m3 / MXFP4 / NVFP4 quant-dequant, ue8m0 scales, FP4 nibble packing.

Spec: docs/model-math.md §2.3 (FP8 block qdq, `act_quant`), §2.4 (MXFP4 qdq, `fp4_act_quant`),
§2.6 (checkpoint weight dequant), §11.2 (e2m1 table, nibble order, E8M0 scales).
NVFP4 (e2m1 + e4m3 scale per 16 + fp32 global scale) covers NVIDIA's requantised checkpoints,
which are third-party conversions (§11.2); the official experts are MXFP4.

Every function here is bit-exact: the scale arithmetic reproduces `[REF-K]`'s
`fast_round_scale(amax, 1/qmax)` (fp32 multiply by the reciprocal, then ceil(log2) from the
IEEE bits), and the element rounding is round-to-nearest-even onto the target grid.
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4  # §2.3: amax = max(|x|, 1e-4)
FP4_AMAX_FLOOR = 6.0 * 2.0**-126  # §2.4: amax = max(|x|, 6·2^-126)
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7; bit 3 = sign (§11.2)
UE8M0_BIAS = 127


# ---------------------------------------------------------------- power-of-two (ue8m0) scales

def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(x)) for positive normal fp32 x, from the IEEE bits (`[REF-K]` fast_log2_ceil/fast_pow2)."""
    bits = x.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - UE8M0_BIAS + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((exponent + UE8M0_BIAS) << 23).view(torch.float32)


def ue8m0_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Power-of-two block scale `fast_round_scale(amax, 1/qmax)`: amax·fp32(1/qmax), rounded up to 2^k."""
    return pow2_ceil(amax.float() * torch.tensor(1.0 / qmax, dtype=torch.float32))


def ue8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales → E8M0 bytes (uint8, biased exponent k + 127)."""
    bits = scale.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF).to(torch.uint8)


def ue8m0_decode(code: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8) or float8_e8m0fnu tensors → fp32 scales 2^(byte − 127)."""
    if code.dtype == torch.float8_e8m0fnu:
        code = code.view(torch.uint8)
    return (code.to(torch.int32) << 23).view(torch.float32)


# ---------------------------------------------------------------- element grids

def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """RNE of fp32 values (already scaled, |x| ≤ 6 after clamping) to e2m1 codes 0..15 (uint8).

    Ties go to the even code: the code index rises at a midpoint only when the code below it is odd.
    """
    mag = x.float().abs().clamp(max=FP4_E2M1_MAX)
    grid = torch.tensor(E2M1_GRID, device=x.device)
    midpoints = (grid[:-1] + grid[1:]) / 2
    lower_is_odd = torch.arange(len(midpoints), device=x.device) % 2 == 1
    above = torch.where(lower_is_odd, mag.unsqueeze(-1) >= midpoints, mag.unsqueeze(-1) > midpoints)
    index = above.sum(-1).to(torch.uint8)
    sign = (x.float() < 0) & (index > 0)  # −0 is encoded as +0
    return index | (sign.to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """e2m1 codes 0..15 → fp32 values (§11.2 table [0,.5,1,1.5,2,3,4,6, −0,…,−6])."""
    code = code.to(torch.int64)
    mag = torch.tensor(E2M1_GRID, device=code.device)[code & 7]
    return torch.where(code >= 8, -mag, mag)


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """RNE onto the e2m1 grid (saturating at ±6), returned as fp32."""
    return e2m1_decode(e2m1_encode(x))


# ---------------------------------------------------------------- FP4 nibble packing (§11.2)

def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Codes [..., n] (0..15) → bytes [..., n/2] uint8: element 2k in the low nibble, 2k+1 in the high.

    The checkpoint stores these bytes as I8: `pack_fp4(c).view(torch.int8)`.
    """
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n/2] (uint8 or the checkpoint's int8) → codes [..., n] uint8."""
    b = packed.contiguous().view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


# ---------------------------------------------------------------- FP8 e4m3 block quant (§2.3)

class BlockSizeError(ValueError):
    """A quantisation block that does not divide the quantised dimension (the tiny model's 64-wide
    activations under the 128-wide FP8 activation blocks)."""


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise BlockSizeError(f"last dim {x.shape[-1]} is not a multiple of block {block}")
    return x.float().unflatten(-1, (-1, block))


def fp8_block_quant(x: torch.Tensor, block: int = 128, scale_fmt: str | None = "ue8m0"):
    """`act_quant(x, block, scale_fmt, inplace=False)` (§2.3).

    x: [..., n] with n % block == 0. Returns (codes [..., n] float8_e4m3fn, scale [..., n/block] fp32);
    scale_fmt "ue8m0" rounds the scale up to a power of two, None keeps s = amax·fp32(1/448).
    """
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR)
    if scale_fmt == "ue8m0":
        scale = ue8m0_scale(amax, FP8_E4M3_MAX)
    elif scale_fmt is None:
        scale = amax * torch.tensor(1.0 / FP8_E4M3_MAX, dtype=torch.float32)
    else:
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}")
    codes = (xb / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.flatten(-2), scale.squeeze(-1)


def fp8_block_dequant(codes: torch.Tensor, scale: torch.Tensor, block: int = 128) -> torch.Tensor:
    """codes [..., n] (e4m3) · scale [..., n/block] → fp32 [..., n]."""
    return (_blocks(codes, block) * scale.float().unsqueeze(-1)).flatten(-2)


def fp8_qdq(x: torch.Tensor, block: int = 64, scale_fmt: str | None = "ue8m0") -> torch.Tensor:
    """FP32 oracle of the in-place QAT simulation `act_quant(x, block, scale_fmt, inplace=True)` (§2.3).

    x: [..., n]. Returns fp32 [..., n] = e4m3_RNE(clamp(x/s)) · s, before the final cast.
    """
    return fp8_block_dequant(*fp8_block_quant(x, block, scale_fmt), block)


def fp8_qdq_lowprec(x: torch.Tensor, block: int = 64, scale_fmt: str | None = "ue8m0") -> torch.Tensor:
    """The reference's in-place qdq: `fp8_qdq` cast back to x.dtype (bf16 in the model)."""
    return fp8_qdq(x, block, scale_fmt).to(x.dtype)


# ---------------------------------------------------------------- MXFP4 e2m1, ue8m0 per 32 (§2.4)

def mxfp4_quant(x: torch.Tensor, block: int = 32):
    """`fp4_act_quant(x, block, inplace=False)` (§2.4).

    x: [..., n]. Returns (codes [..., n] uint8 in 0..15, scale [..., n/block] fp32 power of two).
    """
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR)
    scale = ue8m0_scale(amax, FP4_E2M1_MAX)
    codes = e2m1_encode((xb / scale).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX))
    return codes.flatten(-2), scale.squeeze(-1)


def mxfp4_dequant(codes: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """codes [..., n] (0..15) · scale [..., n/block] (fp32 or e8m0) → fp32 [..., n]."""
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        scale = ue8m0_decode(scale)
    return (_blocks(e2m1_decode(codes), block) * scale.float().unsqueeze(-1)).flatten(-2)


def fp4_qdq(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP32 oracle of `fp4_act_quant(x, block, inplace=True)` (§2.4). x: [..., n] → fp32 [..., n]."""
    return mxfp4_dequant(*mxfp4_quant(x, block), block)


def fp4_qdq_lowprec(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """The reference's in-place FP4 qdq: `fp4_qdq` cast back to x.dtype."""
    return fp4_qdq(x, block).to(x.dtype)


# ---------------------------------------------------------------- NVFP4: e2m1, e4m3 scale per 16, fp32 global

def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor fp32 dequant multiplier amax/(6·448), so block scales use the whole e4m3 range."""
    return (x.float().abs().amax() / (FP4_E2M1_MAX * FP8_E4M3_MAX)).clamp(min=torch.finfo(torch.float32).tiny)


def nvfp4_quant(x: torch.Tensor, block: int = 16, global_scale: torch.Tensor | None = None):
    """NVFP4 quantisation. x: [..., n], n % 16 == 0.

    Returns (codes [..., n] uint8 0..15, block_scale [..., n/block] float8_e4m3fn, global_scale fp32 scalar);
    the value is `e2m1(code) · block_scale · global_scale`.
    """
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    xb = _blocks(x, block)
    block_amax = xb.abs().amax(-1, keepdim=True)
    block_scale = (block_amax / FP4_E2M1_MAX / global_scale).clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    step = block_scale.float() * global_scale
    scaled = torch.where(step > 0, xb / step, torch.zeros_like(xb))
    codes = e2m1_encode(scaled.clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX))
    return codes.flatten(-2), block_scale.squeeze(-1), global_scale.float()


def nvfp4_dequant(codes: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
                  block: int = 16) -> torch.Tensor:
    """codes [..., n] · block_scale [..., n/block] (e4m3) · global_scale → fp32 [..., n]."""
    step = block_scale.float().unsqueeze(-1) * global_scale.float()
    return (_blocks(e2m1_decode(codes), block) * step).flatten(-2)


def nvfp4_qdq(x: torch.Tensor, block: int = 16, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 quant-dequant, fp32 [..., n]."""
    return nvfp4_dequant(*nvfp4_quant(x, block, global_scale), block)


# ---------------------------------------------------------------- checkpoint weights (§2.6, §11.2)

FP8_WEIGHT_BLOCK = 128
FP4_WEIGHT_BLOCK = 32


def _expand_blocks(scale: torch.Tensor, rows: int, cols: int, block_rows: int, block_cols: int) -> torch.Tensor:
    s = scale.float().repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return s[:rows, :cols]


def quant_fp8_weight(w: torch.Tensor):
    """Weight [out, in] → (e4m3 [out, in], E8M0 scale [⌈out/128⌉, ⌈in/128⌉]) as the checkpoint stores it."""
    out_f, in_f = w.shape
    pad = (-out_f % FP8_WEIGHT_BLOCK, -in_f % FP8_WEIGHT_BLOCK)
    wp = torch.nn.functional.pad(w.float(), (0, pad[1], 0, pad[0]))
    tiles = wp.unflatten(0, (-1, FP8_WEIGHT_BLOCK)).unflatten(-1, (-1, FP8_WEIGHT_BLOCK))  # [R,128,C,128]
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=FP8_AMAX_FLOOR)
    scale = ue8m0_scale(amax, FP8_E4M3_MAX)
    expanded = _expand_blocks(scale, out_f, in_f, FP8_WEIGHT_BLOCK, FP8_WEIGHT_BLOCK)
    codes = (w.float() / expanded).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale.to(torch.float8_e8m0fnu)


def dequant_fp8_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """§2.6: W[o, i] = e4m3[o, i] · 2^(e[o//128, i//128] − 127). weight [out, in], scale E8M0 or fp32."""
    scale = ue8m0_decode(scale) if scale.dtype == torch.float8_e8m0fnu else scale
    out_f, in_f = weight.shape
    return weight.float() * _expand_blocks(scale, out_f, in_f, FP8_WEIGHT_BLOCK, FP8_WEIGHT_BLOCK)


def quant_fp4_weight(w: torch.Tensor):
    """Weight [out, in] → (packed int8 [out, in/2], E8M0 scale [out, in/32]) as the checkpoint stores it."""
    codes, scale = mxfp4_quant(w, FP4_WEIGHT_BLOCK)
    return pack_fp4(codes).view(torch.int8), scale.to(torch.float8_e8m0fnu)


def dequant_fp4_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """§2.6: W[o, i] = e2m1[o, i] · 2^(e[o, i//32] − 127). weight packed [out, in/2] (I8), scale [out, in/32]."""
    return mxfp4_dequant(unpack_fp4(weight), scale, FP4_WEIGHT_BLOCK)


def quant_nvfp4_weight(w: torch.Tensor):
    """Weight [out, in] → (packed uint8 [out, in/2], e4m3 block scale [out, in/16], fp32 global scale)."""
    codes, block_scale, global_scale = nvfp4_quant(w)
    return pack_fp4(codes), block_scale, global_scale


def dequant_nvfp4_weight(weight: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 weight [out, in/2] packed, e4m3 scale [out, in/16], fp32 global scale → fp32 [out, in]."""
    return nvfp4_dequant(unpack_fp4(weight), block_scale, global_scale)
