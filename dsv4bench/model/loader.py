"""Strict loader for HF safetensors checkpoints in the official DSV4 layout (docs/model-math.md §11).

Opening a checkpoint checks everything before weights are loaded (the file-level rules are in
`dsv4bench.model.validate`):

* the directory, `config.json` and the shards exist; pickle / torch.save files are refused;
* `config.json` and the index are strict JSON of the right types, the configuration valid;
* each shard header is well formed and its byte ranges tile the file (a truncated shard names
  the tensors it cuts off);
* the index's weight map agrees with the shard headers; no tensor is stored twice;
* the set of tensors equals the inventory derived from the config (missing, unexpected,
  wrong shape, wrong dtype), the expert format (MXFP4 or NVFP4) being read from the names;
* the hash layers' `tid2eid` tables hold expert ids below n_routed_experts (the only tensor
  values read at open);
* `tokenizer.json`, when present, loads and stays inside the vocabulary.

Problems are reported in one `CheckpointError` naming the files and tensors (every problem of the
shards at once; a bad config.json or index stops the check there).
Weights are then read a load unit at a time (top level, one layer, one MTP block) through
memory-mapped `safe_open`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dsv4bench.model.config import ConfigError, ModelConfig
from dsv4bench.model.inventory import INDEX_NAME, ST_DTYPES, TensorSpec, expected_tensors, group_of
from dsv4bench.model.tokenizer import load_tokenizer
from dsv4bench.model.validate import (
    MAX_LISTED,
    CheckpointError,
    StoredTensor,
    listing,
    read_header,
    read_json_object,
    read_weight_map,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _fmt(spec: StoredTensor | TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"


def detect_expert_dtype(names: set[str] | dict) -> str:
    """NVFP4 checkpoints carry a per-tensor `weight_scale_2` on the routed experts."""
    return "nvfp4" if any(".experts." in n and n.endswith(".weight_scale_2") for n in names) else "fp4"


def check_inventory(stored: dict[str, StoredTensor], expected: dict[str, TensorSpec]) -> list[str]:
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
        problems.append(f"missing {len(missing)} tensor(s): " + listing(missing))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): " + listing(unexpected))
    for kind, rows in (("wrong shape", shape), ("wrong dtype", dtype)):
        if rows:
            problems.append(f"{kind} in {len(rows)} tensor(s): " + "; ".join(rows[:MAX_LISTED])
                            + (f"; ... and {len(rows) - MAX_LISTED} more" if len(rows) > MAX_LISTED else ""))
    return problems


def _read_config(root: Path) -> ModelConfig:
    path = root / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{root} has no config.json")
    try:
        return ModelConfig.from_hf(read_json_object(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _shard_files(root: Path) -> tuple[list[str], dict[str, str] | None]:
    index = root / INDEX_NAME
    if index.exists():
        weight_map = read_weight_map(index)
        files = sorted(set(weight_map.values()))
        pickles = [f for f in files if not f.endswith(".safetensors")]
        if pickles:
            raise CheckpointError(f"the index points at non-safetensors files (safetensors only): {listing(pickles)}")
        absent = [f for f in files if not (root / f).is_file()]
        if absent:
            raise CheckpointError(f"shard file(s) named in {INDEX_NAME} are missing: {listing(absent)}")
        return files, weight_map
    files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(f"{root} holds only pickle checkpoints ({listing(pickles)}); safetensors only")
        raise CheckpointError(f"{root} holds no *.safetensors files")
    return files, None


def _read_headers(root: Path, files: list[str]) -> tuple[dict[str, StoredTensor], list[str]]:
    stored: dict[str, StoredTensor] = {}
    problems: list[str] = []
    for fname in files:
        try:
            header = read_header(root / fname)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        dup = [f"{n} ({stored[n].shard}, {fname})" for n in header if n in stored]
        if dup:
            problems.append(f"tensor(s) stored in more than one shard: {listing(dup)}")
        stored.update(header)
    return stored, problems


def _index_problems(weight_map: dict[str, str], stored: dict[str, StoredTensor]) -> list[str]:
    problems = []
    wrong = [n for n, f in weight_map.items() if n in stored and stored[n].shard != f]
    lost = [n for n, f in weight_map.items() if n not in stored]
    if wrong:
        problems.append(f"{INDEX_NAME} maps tensor(s) to the wrong shard: {listing(wrong)}")
    if lost:
        problems.append(f"{INDEX_NAME} lists tensor(s) absent from their shard: {listing(lost)}")
    return problems


def _read_tensors(path: Path, names: list[str], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {n: f.get_tensor(n) for n in names}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path.name} cannot be read ({e}); was it changed after the checkpoint "
                              "was opened?") from None


def _tid2eid_problems(root: Path, stored: dict[str, StoredTensor], cfg: ModelConfig) -> list[str]:
    """Hash routing indexes the experts with tid2eid[token]: every id must be an expert."""
    n = cfg.n_routed_experts
    problems = []
    for name in sorted(t for t in stored if t.endswith(".gate.tid2eid")):
        shard = stored[name].shard
        ids = _read_tensors(root / shard, [name])[name]
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            token, col = (int(i) for i in bad.nonzero()[0])
            problems.append(f"{shard}: {name} holds {int(bad.sum())} expert id(s) outside 0..{n - 1} "
                            f"(n_routed_experts={n}), the first {int(ids[token, col])} for token id {token}")
    return problems


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
            config = _read_config(root)
        files, weight_map = _shard_files(root)
        stored, problems = _read_headers(root, files)
        if weight_map is not None and not problems:
            problems += _index_problems(weight_map, stored)
        if not problems:
            config = config.with_(expert_dtype=detect_expert_dtype(stored))
            problems += check_inventory(stored, expected_tensors(config))
        if not problems:
            problems += _tid2eid_problems(root, stored, config)
        try:
            load_tokenizer(config, root)
        except (CheckpointError, ConfigError) as e:
            problems.append(str(e))
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
            out.update(_read_tensors(self.root / shard, ns, device))
        for n, t in out.items():
            assert t.dtype == ST_DTYPES[self.tensors[n].dtype], n
        return out
