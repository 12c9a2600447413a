"""Strict loader for HF safetensors checkpoints in the official DSV4 layout (DSV4_SPEC.md §11).

Opening a checkpoint reads only the shard headers (8-byte length + JSON) and checks everything
before a byte of weight data is touched:

* the directory, `config.json` and the shards exist; pickle / torch.save files are refused;
* each header parses, each tensor's byte range matches its dtype and shape and lies inside the
  file (a truncated shard names the tensors it cuts off);
* the index's weight map agrees with the shard headers;
* the set of tensors equals the inventory derived from the config (missing, unexpected,
  wrong shape, wrong dtype), the expert format (MXFP4 or NVFP4) being read from the names.

Every problem found is reported at once in a `CheckpointError` naming the tensors. Weights are
then read a load unit at a time (top level, one layer, one MTP block) through memory-mapped
`safe_open`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from dsv4bench.model.config import ConfigError, ModelConfig
from dsv4bench.model.inventory import (
    INDEX_NAME,
    ST_DTYPES,
    ST_ITEMSIZE,
    TensorSpec,
    expected_tensors,
    group_of,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER = 100 << 20
MAX_LISTED = 8  # names listed per problem kind before "... and N more"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names every offending file and tensor."""


@dataclass(frozen=True)
class StoredTensor:
    shard: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets of the data
    end: int


def _looks_like_pickle(head: bytes) -> bool:
    return head[:4] == b"PK\x03\x04" or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5)


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Parse and check one safetensors shard header; raise CheckpointError naming the problem."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if _looks_like_pickle(head):
            raise CheckpointError(
                f"{path.name} is a pickle/torch.save file, not safetensors; refusing to load it "
                "(pickle can execute code)"
            )
        if len(head) < 8:
            raise CheckpointError(f"{path.name} is truncated: {size} bytes, no safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise CheckpointError(f"{path.name} is not a safetensors file (header length {n} is implausible)")
        if 8 + n > size:
            raise CheckpointError(f"{path.name} is truncated: {size} bytes, its header alone needs {8 + n}")
        try:
            meta = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path.name} has a corrupt safetensors header ({e})") from None
    data0 = 8 + n
    out: dict[str, StoredTensor] = {}
    cut, bad = [], []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        if dtype not in ST_ITEMSIZE or e - b != numel * ST_ITEMSIZE[dtype]:
            bad.append(name)
        if data0 + e > size:
            cut.append(name)
        out[name] = StoredTensor(path.name, dtype, shape, data0 + b, data0 + e)
    if cut:
        raise CheckpointError(
            f"{path.name} is truncated: {size} bytes, but {len(cut)} tensor(s) extend past the end: "
            + _listing(cut)
        )
    if bad:
        raise CheckpointError(f"{path.name} has tensors whose byte range does not match dtype x shape: " + _listing(bad))
    return out


def _listing(names: list[str]) -> str:
    names = sorted(names)
    s = ", ".join(names[:MAX_LISTED])
    return s + (f", ... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _fmt(spec: StoredTensor | TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"


def detect_expert_dtype(names: set[str] | dict) -> str:
    """NVFP4 checkpoints carry a per-tensor `weight_scale_2` on the routed experts."""
    return "nvfp4" if any(".experts." in n and n.endswith(".weight_scale_2") for n in names) else "fp4"


def validate(stored: dict[str, StoredTensor], expected: dict[str, TensorSpec]) -> list[str]:
    """Problems (one line each) between what is stored and what the config implies."""
    problems = []
    missing = [n for n in expected if n not in stored]
    unexpected = [n for n in stored if n not in expected]
    shape = [
        f"{n} is {_fmt(stored[n])}, expected {_fmt(s)}"
        for n, s in expected.items()
        if n in stored and stored[n].shape != s.shape
    ]
    dtype = [
        f"{n} is {_fmt(stored[n])}, expected {_fmt(s)}"
        for n, s in expected.items()
        if n in stored and stored[n].shape == s.shape and stored[n].dtype != s.dtype
    ]
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): " + _listing(missing))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): " + _listing(unexpected))
    for kind, rows in (("wrong shape", shape), ("wrong dtype", dtype)):
        if rows:
            problems.append(f"{kind} in {len(rows)} tensor(s): " + "; ".join(rows[:MAX_LISTED])
                            + (f"; ... and {len(rows) - MAX_LISTED} more" if len(rows) > MAX_LISTED else ""))
    return problems


def _shard_files(root: Path) -> tuple[list[str], dict[str, str] | None]:
    index = root / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({e})") from None
        files = sorted(set(weight_map.values()))
        pickles = [f for f in files if not f.endswith(".safetensors")]
        if pickles:
            raise CheckpointError(f"the index points at non-safetensors files (safetensors only): {_listing(pickles)}")
        absent = [f for f in files if not (root / f).is_file()]
        if absent:
            raise CheckpointError(f"shard file(s) named in {INDEX_NAME} are missing: {_listing(absent)}")
        return files, weight_map
    files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(f"{root} holds only pickle checkpoints ({_listing(pickles)}); safetensors only")
        raise CheckpointError(f"{root} holds no *.safetensors files")
    return files, None


@dataclass
class Checkpoint:
    root: Path
    config: ModelConfig
    tensors: dict[str, StoredTensor]
    _by_group: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, root: str | Path, config: ModelConfig | None = None) -> "Checkpoint":
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint directory {root} does not exist")
        if config is None:
            cfg_path = root / "config.json"
            if not cfg_path.is_file():
                raise CheckpointError(f"{root} has no config.json")
            try:
                config = ModelConfig.from_hf(json.loads(cfg_path.read_text()))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{cfg_path} is not valid JSON ({e})") from None
            except ConfigError as e:
                raise CheckpointError(f"{cfg_path}: {e}") from None
        files, weight_map = _shard_files(root)
        stored: dict[str, StoredTensor] = {}
        problems: list[str] = []
        for fname in files:
            try:
                header = read_header(root / fname)
            except CheckpointError as e:
                problems.append(str(e))
                continue
            dup = [n for n in header if n in stored]
            if dup:
                problems.append(f"tensor(s) stored in more than one shard: {_listing(dup)}")
            stored.update(header)
        if weight_map is not None and not problems:
            wrong = [n for n, f in weight_map.items() if n in stored and stored[n].shard != f]
            lost = [n for n, f in weight_map.items() if n not in stored]
            if wrong:
                problems.append(f"{INDEX_NAME} maps tensor(s) to the wrong shard: {_listing(wrong)}")
            if lost:
                problems.append(f"{INDEX_NAME} lists tensor(s) absent from their shard: {_listing(lost)}")
        if not problems:
            config = config.with_(expert_dtype=detect_expert_dtype(stored))
            problems += validate(stored, expected_tensors(config))
        if problems:
            raise CheckpointError(f"checkpoint {root} is invalid:\n  - " + "\n  - ".join(problems))
        ckpt = cls(root, config, stored)
        for n in stored:
            ckpt._by_group.setdefault(group_of(n), []).append(n)
        return ckpt

    def load_group(self, group: str, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The tensors of one load unit ("top", "layers.i", "mtp.k"), memory-mapped from disk."""
        names = self._by_group.get(group)
        if not names:
            raise KeyError(f"no load unit {group!r} in {self.root}")
        by_shard: dict[str, list[str]] = {}
        for n in names:
            by_shard.setdefault(self.tensors[n].shard, []).append(n)
        out: dict[str, torch.Tensor] = {}
        for shard, ns in by_shard.items():
            with safe_open(str(self.root / shard), framework="pt", device=str(device)) as f:
                for n in ns:
                    t = f.get_tensor(n)
                    assert t.dtype == ST_DTYPES[self.tensors[n].dtype], n
                    out[n] = t
        return out
