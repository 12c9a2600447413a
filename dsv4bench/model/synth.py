"""Random checkpoints in exactly the official HF layout (docs/model-math.md §11), so the real loader
path is what runs on them.

One shard per load unit (top level, each layer, each MTP block), a `model.safetensors.index.json`
weight map and a `config.json`. Every tensor is drawn from its own generator seeded by
(seed, name), so a checkpoint is reproducible bit for bit and can be written a layer at a time.

The values are codes and scales, not quantised floats: FP8 weights are e4m3 casts of N(0,1)
with ue8m0 block scales near 1/sqrt(fan_in); packed FP4 bytes are uniform (every e2m1 nibble
equally likely) with their block scales chosen for the same fan-in variance. A random model
built this way keeps O(1) activations through every layer.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import zlib
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from dsv4bench.model.config import ModelConfig
from dsv4bench.model.inventory import INDEX_NAME, ST_DTYPES, TensorSpec, group_tensors, groups

E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)  # rms of a uniform nibble


class SynthError(RuntimeError):
    pass


def _gen(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**64)


def _e8m0(exponents: torch.Tensor) -> torch.Tensor:
    return exponents.clamp(1, 254).to(torch.uint8).view(torch.float8_e8m0fnu)


def _pow2_exponent(x: float) -> int:
    return 127 + round(math.log2(x))


def make_tensor(name: str, spec: TensorSpec, specs: dict[str, TensorSpec], seed: int,
                device: str | torch.device = "cpu") -> torch.Tensor:
    """One tensor, drawn on `device` from its own generator there: the same seed gives the same
    tensor on the same device kind (a CPU and a CUDA generator draw different streams). `specs`: the
    tensors of its load unit (a scale's rule reads its weight's shape)."""
    g = _gen(seed, name, device)
    shape, dt = spec.shape, spec.dtype
    on = {"generator": g, "device": device}

    def randn(std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, **on) * std + mean

    if dt == "F8_E4M3" and name.endswith(".weight"):
        return randn().to(torch.float8_e4m3fn)
    if dt == "F8_E4M3":  # NVFP4 per-16 scale, a positive e4m3 value around 1
        return (torch.rand(shape, **on) * 1.5 + 0.5).to(torch.float8_e4m3fn)
    if dt in ("I8", "U8"):  # packed e2m1 pairs: any byte is a valid pair of codes
        return torch.randint(0, 256, shape, dtype=torch.uint8, **on).view(ST_DTYPES[dt])
    if dt == "F8_E8M0":
        w = specs[name.rsplit(".", 1)[0] + ".weight"]  # the weight this scale belongs to
        packed = w.dtype == "I8"
        k = w.shape[1] * (2 if packed else 1)
        target = k ** -0.5 / (E2M1_RMS if packed else 1.0)
        base = _pow2_exponent(target)
        return _e8m0(base - torch.randint(0, 2, shape, **on))
    if dt == "I64":  # tid2eid: n_activated distinct experts per token id
        n_experts = specs[name.replace("tid2eid", "weight")].shape[0]
        return torch.rand(shape[0], n_experts, **on).argsort(-1)[:, : shape[1]].contiguous()
    if dt == "F32":
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("weight_scale_2"):  # NVFP4 global scale: e2m1 · e4m3(~1.25) · s ~ 1/sqrt(K)
            k = specs[name.replace("weight_scale_2", "weight")].shape[1] * 2
            return torch.tensor(k ** -0.5 / (E2M1_RMS * 1.25), device=device)
        if name.endswith("input_scale"):
            return torch.tensor(1.0 / 448.0, device=device)
        if leaf.endswith("_fn"):
            return randn(shape[1] ** -0.5)
        if leaf.endswith("_base"):
            return randn(0.5)
        if leaf.endswith("_scale"):
            return torch.rand(shape, **on) * 0.5 + 0.75
        if leaf == "attn_sink":
            return randn()
        if leaf == "ape":
            return randn(0.5)
        if leaf == "bias":
            return randn(0.1)
    if dt == "BF16":
        if name.endswith("norm.weight"):
            return randn(0.1, 1.0).bfloat16()
        if name == "embed.weight":
            return randn().bfloat16()
        return randn(shape[-1] ** -0.5).bfloat16()
    raise SynthError(f"no synthesis rule for {name} ({dt})")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_checkpoint(
    cfg: ModelConfig,
    out: Path,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Write a random checkpoint for `cfg` into `out` (created); returns `out`.

    Refuses (SynthError) when the directory already holds a checkpoint or the disk lacks space.
    """
    out = Path(out)
    if out.exists() and ((out / INDEX_NAME).exists() or any(out.glob("*.safetensors"))):
        raise SynthError(f"{out} already holds a checkpoint; choose an empty directory")
    units = groups(cfg)
    inventories = [group_tensors(cfg, u) for u in units]
    total = sum(s.nbytes for inv in inventories for s in inv.values())
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if total > free:
        raise SynthError(f"{cfg.name} needs {total / 1e9:.1f} GB but {existing} has {free / 1e9:.1f} GB free")
    out.mkdir(parents=True, exist_ok=True)
    mask = _umask()
    weight_map: dict[str, str] = {}
    for i, (unit, inv) in enumerate(zip(units, inventories)):
        fname = shard_name(i, len(units))
        tensors = {name: make_tensor(name, spec, inv, seed) for name, spec in inv.items()}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        os.chmod(out / fname, 0o666 & ~mask)  # safetensors creates 0600; a checkpoint is meant to be shared
        weight_map.update({name: fname for name in tensors})
        del tensors
        if progress:
            progress(unit, i + 1, len(units))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=1))
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    return out
