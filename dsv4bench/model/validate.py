"""Checks on the files of a checkpoint directory before a byte of weight data is read.

Every problem becomes a `CheckpointError` whose message names the file and the tensor or key, so
a malformed checkpoint is one clear error and never a traceback from inside `json`, the
safetensors reader or the model.

* JSON files (`config.json`, the index): UTF-8, valid JSON, no key given twice, the expected
  types;
* safetensors headers, to the rules the safetensors reader enforces when the data is mapped:
  the 8-byte length and the header fit in the file; the header is a JSON object of entries
  `{"dtype": str, "shape": [int >= 0], "data_offsets": [begin, end]}` (+ an optional
  `__metadata__` of strings); a known dtype; `end - begin` = dtype size x shape; and the byte
  ranges tile the data section exactly: from 0, no overlap, no gap, nothing past the end of the
  file (a truncated shard names the tensors it cuts off) and nothing after the last tensor.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dsv4bench.model.config import is_int, shown
from dsv4bench.model.inventory import ST_ITEMSIZE

MAX_HEADER = 100_000_000  # the safetensors reader's own limit on the header length
MAX_LISTED = 8  # names listed per problem kind before "... and N more"
ENTRY_KEYS = ("dtype", "shape", "data_offsets")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names every offending file and tensor."""


@dataclass(frozen=True)
class StoredTensor:
    shard: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets of the data
    end: int


def listing(names: Iterable[str], sep: str = ", ") -> str:
    names = sorted(names)
    s = sep.join(names[:MAX_LISTED])
    return s + (f"{sep}... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


# ---- JSON ------------------------------------------------------------------------------------------

def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not UTF-8 text (invalid byte at offset {e.start})") from None
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror})") from None


def _no_duplicates(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict = {}
        for k, v in pairs:
            if k in seen:
                raise CheckpointError(f"{where}: key {k!r} appears more than once")
            seen[k] = v
        return seen
    return hook


def parse_json_object(text: str, where: str) -> dict:
    """Strict JSON: a key given twice is an error; the top level must be an object. (NaN and
    Infinity parse: the type and range checks of each value name the key holding one.)"""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates(where))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{where} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} must hold a JSON object, not {type(value).__name__}")
    return value


def read_json_object(path: Path) -> dict:
    return parse_json_object(read_text(path), str(path))


def read_weight_map(path: Path) -> dict[str, str]:
    """The `weight_map` of a `model.safetensors.index.json`: tensor name -> shard file name."""
    index = read_json_object(path)
    if "weight_map" not in index:
        raise CheckpointError(f"{path} has no 'weight_map'")
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{path}: 'weight_map' must be a JSON object of tensor -> shard file, "
                              f"not {shown(weight_map)}")
    bad = [n for n, f in weight_map.items() if not isinstance(f, str) or not f or Path(f).name != f]
    if bad:
        raise CheckpointError(f"{path}: 'weight_map' must map each tensor to a file name in the checkpoint "
                              "directory; not so for " + "; ".join(f"{n} -> {shown(weight_map[n])}"
                                                                  for n in sorted(bad)[:MAX_LISTED]))
    return weight_map


# ---- safetensors headers ---------------------------------------------------------------------------

def _looks_like_pickle(head: bytes) -> bool:
    return head[:4] == b"PK\x03\x04" or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _read_header_json(path: Path) -> tuple[dict, int, int]:
    """(the header object, start of the data section, file size)."""
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
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path.name} has a corrupt safetensors header (not UTF-8 at byte "
                              f"{8 + e.start})") from None
    where = f"{path.name}: the safetensors header"
    return parse_json_object(text, where), 8 + n, size


def _entry_problem(info: Any) -> str | None:
    """What is wrong with one tensor's header entry (types, dtype, byte count), or None."""
    if not isinstance(info, dict):
        return f"entry must be a JSON object, not {shown(info)}"
    absent = [k for k in ENTRY_KEYS if k not in info]
    if absent:
        return "entry has no " + " and no ".join(repr(k) for k in absent)
    dtype, shape, offsets = (info[k] for k in ENTRY_KEYS)
    if not isinstance(dtype, str):
        return f"'dtype' must be a string, not {shown(dtype)}"
    if dtype not in ST_ITEMSIZE:
        return f"unknown 'dtype' {dtype!r} (known: {', '.join(ST_ITEMSIZE)})"
    if not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape):
        return f"'shape' must be a list of integers >= 0, not {shown(shape)}"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]):
        return f"'data_offsets' must be [begin, end] with 0 <= begin <= end, not {shown(offsets)}"
    nbytes = ST_ITEMSIZE[dtype]
    for s in shape:
        nbytes *= s
    if offsets[1] - offsets[0] != nbytes:
        return (f"byte range {offsets} ({offsets[1] - offsets[0]} bytes) does not match dtype x shape "
                f"{dtype}{shape} ({nbytes} bytes)")
    return None


def _layout_problems(path: Path, tensors: dict[str, StoredTensor], data0: int, size: int) -> list[str]:
    """The byte ranges must tile [data0, size) in order: from 0, no overlap, no gap, no excess."""
    problems, pos, last = [], data0, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end, kv[0])):
        if t.begin < pos:
            problems.append(f"{name} (bytes {t.begin - data0}..{t.end - data0}) overlaps {last}")
        elif t.begin > pos:
            problems.append(f"{t.begin - pos} bytes before {name} belong to no tensor")
        if t.end >= pos:
            pos, last = t.end, name
    if pos < size:
        problems.append(f"{size - pos} bytes after the last tensor ({last or 'none'}) belong to no tensor")
    return problems


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Parse and check one safetensors shard header; raise CheckpointError naming every problem."""
    meta, data0, size = _read_header_json(path)
    problems = []
    extra = meta.get("__metadata__")
    if extra is not None and not (isinstance(extra, dict) and all(isinstance(v, str) for v in extra.values())):
        problems.append(f"'__metadata__' must be a JSON object of strings, not {shown(extra)}")
    out: dict[str, StoredTensor] = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        why = _entry_problem(info)
        if why:
            problems.append(f"{name}: {why}")
            continue
        (b, e) = info["data_offsets"]
        out[name] = StoredTensor(path.name, info["dtype"], tuple(info["shape"]), data0 + b, data0 + e)
    if problems:
        raise CheckpointError(f"{path.name} has a malformed safetensors header: " + listing(problems, "; "))
    cut = [n for n, t in out.items() if t.end > size]
    if cut:
        raise CheckpointError(f"{path.name} is truncated: {size} bytes, but {len(cut)} tensor(s) extend past "
                              "the end: " + listing(cut))
    problems = _layout_problems(path, out, data0, size)
    if problems:
        raise CheckpointError(f"{path.name}: the data_offsets do not tile the data section: "
                              + listing(problems, "; "))
    return out
