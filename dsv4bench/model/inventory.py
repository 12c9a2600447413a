"""The expected tensor inventory of an official HF checkpoint, derived from the config alone
(docs/model-math.md §11.2). The loader validates against it and the synthesiser writes exactly it.

Names are the inference names of the official files (no `model.` prefix); the scale of an FP8 or
MXFP4 `X.weight` is `X.scale` (F8_E8M0). FP8 weights carry one ue8m0 scale per 128x128 block;
MXFP4 experts are e2m1 pairs packed in I8 along K (low nibble = even element) with one ue8m0
scale per 32 elements of K.

NVFP4 (NVIDIA's requantised checkpoints, ModelOpt layout) replaces each routed expert's
`weight`/`scale` with `weight` U8 [out, in/2] (same nibble packing), `weight_scale` F8_E4M3
[out, in/16], `weight_scale_2` F32 [] (global) and `input_scale` F32 [] (activation, unused by
the FP32 oracle). Everything else is unchanged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterator

import torch

from dsv4bench.model.config import ModelConfig

# safetensors dtype string <-> torch dtype
ST_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}
ST_ITEMSIZE = {k: torch.empty((), dtype=v).element_size() for k, v in ST_DTYPES.items()}

INDEX_NAME = "model.safetensors.index.json"
FP8_BLOCK = 128
MXFP4_BLOCK = 32
NVFP4_BLOCK = 16


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name

    @property
    def nbytes(self) -> int:
        n = ST_ITEMSIZE[self.dtype]
        for s in self.shape:
            n *= s
        return n


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fp8(name: str, out: int, inp: int) -> Iterator[tuple[str, TensorSpec]]:
    yield f"{name}.weight", TensorSpec((out, inp), "F8_E4M3")
    yield f"{name}.scale", TensorSpec((_cdiv(out, FP8_BLOCK), _cdiv(inp, FP8_BLOCK)), "F8_E8M0")


def _bf16(name: str, *shape: int) -> tuple[str, TensorSpec]:
    return name, TensorSpec(tuple(shape), "BF16")


def _f32(name: str, *shape: int) -> tuple[str, TensorSpec]:
    return name, TensorSpec(tuple(shape), "F32")


def _expert_linear(name: str, out: int, inp: int, fmt: str) -> Iterator[tuple[str, TensorSpec]]:
    if fmt == "fp4":
        yield f"{name}.weight", TensorSpec((out, inp // 2), "I8")
        yield f"{name}.scale", TensorSpec((out, inp // MXFP4_BLOCK), "F8_E8M0")
    else:  # nvfp4
        yield f"{name}.weight", TensorSpec((out, inp // 2), "U8")
        yield f"{name}.weight_scale", TensorSpec((out, inp // NVFP4_BLOCK), "F8_E4M3")
        yield f"{name}.weight_scale_2", TensorSpec((), "F32")
        yield f"{name}.input_scale", TensorSpec((), "F32")


def _hc(prefix: str, cfg: ModelConfig, rows: int, n_scale: int) -> Iterator[tuple[str, TensorSpec]]:
    yield _f32(f"{prefix}_fn", rows, cfg.hc_mult * cfg.dim)
    yield _f32(f"{prefix}_base", rows)
    yield _f32(f"{prefix}_scale", n_scale)


def _compressor(prefix: str, cfg: ModelConfig, ratio: int, d: int) -> Iterator[tuple[str, TensorSpec]]:
    coff = 2 if ratio == 4 else 1
    yield _f32(f"{prefix}.ape", ratio, coff * d)
    yield _bf16(f"{prefix}.wkv.weight", coff * d, cfg.dim)
    yield _bf16(f"{prefix}.wgate.weight", coff * d, cfg.dim)
    yield _bf16(f"{prefix}.norm.weight", d)


def block_tensors(cfg: ModelConfig, layer: int, prefix: str) -> Iterator[tuple[str, TensorSpec]]:
    """One transformer block (attention + MoE); `layer` selects the ratio and the routing."""
    D, ratio = cfg.dim, cfg.ratio(layer)
    yield from _hc(f"{prefix}.hc_attn", cfg, cfg.hc_mix, 3)
    yield from _hc(f"{prefix}.hc_ffn", cfg, cfg.hc_mix, 3)
    yield _bf16(f"{prefix}.attn_norm.weight", D)
    yield _bf16(f"{prefix}.ffn_norm.weight", D)
    a = f"{prefix}.attn"
    yield _f32(f"{a}.attn_sink", cfg.n_heads)
    yield from _fp8(f"{a}.wq_a", cfg.q_lora_rank, D)
    yield _bf16(f"{a}.q_norm.weight", cfg.q_lora_rank)
    yield from _fp8(f"{a}.wq_b", cfg.n_heads * cfg.head_dim, cfg.q_lora_rank)
    yield from _fp8(f"{a}.wkv", cfg.head_dim, D)
    yield _bf16(f"{a}.kv_norm.weight", cfg.head_dim)
    yield from _fp8(f"{a}.wo_a", cfg.o_groups * cfg.o_lora_rank, cfg.n_heads * cfg.head_dim // cfg.o_groups)
    yield from _fp8(f"{a}.wo_b", D, cfg.o_groups * cfg.o_lora_rank)
    if ratio:
        yield from _compressor(f"{a}.compressor", cfg, ratio, cfg.head_dim)
    if ratio == 4:
        yield from _fp8(f"{a}.indexer.wq_b", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
        yield _bf16(f"{a}.indexer.weights_proj.weight", cfg.index_n_heads, D)
        yield from _compressor(f"{a}.indexer.compressor", cfg, ratio, cfg.index_head_dim)
    f = f"{prefix}.ffn"
    yield _bf16(f"{f}.gate.weight", cfg.n_routed_experts, D)
    if cfg.is_hash(layer):
        yield f"{f}.gate.tid2eid", TensorSpec((cfg.vocab_size, cfg.n_activated_experts), "I64")
    else:
        yield _f32(f"{f}.gate.bias", cfg.n_routed_experts)
    inter = cfg.moe_inter_dim
    for e in range(cfg.n_routed_experts):
        x = f"{f}.experts.{e}"
        yield from _expert_linear(f"{x}.w1", inter, D, cfg.expert_dtype)
        yield from _expert_linear(f"{x}.w2", D, inter, cfg.expert_dtype)
        yield from _expert_linear(f"{x}.w3", inter, D, cfg.expert_dtype)
    s = f"{f}.shared_experts"
    yield from _fp8(f"{s}.w1", inter, D)
    yield from _fp8(f"{s}.w2", D, inter)
    yield from _fp8(f"{s}.w3", inter, D)


def top_level_tensors(cfg: ModelConfig) -> Iterator[tuple[str, TensorSpec]]:
    yield _bf16("embed.weight", cfg.vocab_size, cfg.dim)
    yield _bf16("head.weight", cfg.vocab_size, cfg.dim)
    yield _bf16("norm.weight", cfg.dim)
    yield from _hc("hc_head", cfg, cfg.hc_mult, 1)


def mtp_tensors(cfg: ModelConfig, k: int) -> Iterator[tuple[str, TensorSpec]]:
    """MTP block k: its own projections, norms and hc_head; embed/head are shared (absent)."""
    p = f"mtp.{k}"
    yield from _fp8(f"{p}.e_proj", cfg.dim, cfg.dim)
    yield from _fp8(f"{p}.h_proj", cfg.dim, cfg.dim)
    for n in ("enorm", "hnorm", "norm"):
        yield _bf16(f"{p}.{n}.weight", cfg.dim)
    yield from _hc(f"{p}.hc_head", cfg, cfg.hc_mult, 1)
    yield from block_tensors(cfg, cfg.n_layers + k, p)


def groups(cfg: ModelConfig) -> list[str]:
    """Load units, in order: "top", "layers.0" ... "layers.{n-1}", "mtp.0" ..."""
    return ["top"] + [f"layers.{i}" for i in range(cfg.n_layers)] + [f"mtp.{k}" for k in range(cfg.n_mtp_layers)]


def group_tensors(cfg: ModelConfig, group: str) -> dict[str, TensorSpec]:
    if group == "top":
        return dict(top_level_tensors(cfg))
    kind, idx = group.split(".")
    if kind == "layers":
        return dict(block_tensors(cfg, int(idx), group))
    return dict(mtp_tensors(cfg, int(idx)))


def group_of(name: str) -> str:
    """The load unit a tensor name belongs to ("layers.3.attn.wkv.weight" -> "layers.3")."""
    parts = name.split(".")
    if parts[0] in ("layers", "mtp") and len(parts) > 1 and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return "top"


def expected_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    out: dict[str, TensorSpec] = {}
    for g in groups(cfg):
        out.update(group_tensors(cfg, g))
    return out


def dtype_counts(specs: dict[str, TensorSpec]) -> Counter:
    return Counter(s.dtype for s in specs.values())
