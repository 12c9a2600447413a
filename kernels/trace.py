"""Trace-time layout recorder: kernels name their layouts; the `layouts` command and the lints read them.

Kernels call these functions inside @cute.jit / @cute.kernel code. Python runs there at trace time
only, so a call costs nothing in the generated code; with no recording active (every compile
outside `recording()`) each call returns at its first line.

    from kernels import trace as rec
    rec.record("sK", sK)                                    # any CuTe object: text only
    tBgK = rec.record_tma_slice("K tile after TMA partition", tBgK, (None, 0, None, 0), tile_mode=2)
    v = rec.record_slice("x vector j", tXgX, ((None, j), None, None))   # bounds-checked slice
    rec.record_barrier("KV stage", tx_count, loads={"K": sK_stage, "V": sV_stage})
    rec.record_pipeline("S ready", pipeline.PipelineUmmaAsync, consumer_group, consumer_warps=4)

Entries are plain JSON-able dicts (stored with cached kernels so lints re-run on a cache hit).
This module is a leaf of kernels/: it imports nothing from the harness, which reads it.
"""

from __future__ import annotations

import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

_active: "Recording | None" = None
SWIZZLE = re.compile(r"S<\d+,\d+,\d+>")


@dataclass
class Recording:
    entries: list[dict] = field(default_factory=list)  # {group, stage, kind, fields: {name: text}}
    facts: list[dict] = field(default_factory=list)  # {rule, stage, ...}: what the lints check

    def to_json(self) -> dict:
        return {"entries": self.entries, "facts": self.facts}

    @classmethod
    def from_json(cls, d: dict) -> "Recording":
        return cls(list(d.get("entries", [])), list(d.get("facts", [])))


@contextmanager
def recording():
    """Record every call made while tracing inside this block (one compile at a time), plus, with no
    help from the kernel, each kernel launch (grid, block, cluster, smem) and each pipeline created."""
    global _active
    outer, _active = _active, Recording()
    undo = _install_hooks() if outer is None else []
    try:
        yield _active
    finally:
        for restore in undo:
            restore()
        _active = outer


PIPELINES = ("PipelineAsync", "PipelineCpAsync", "PipelineTmaAsync", "PipelineTmaStore", "PipelineTmaUmma",
             "PipelineUmmaAsync", "PipelineAsyncUmma", "PipelineTmaMultiConsumersAsync")


def _install_hooks() -> list:
    """Wrap KernelLauncher.launch and the pipelines' create() while recording; returns the undos."""
    import cutlass.pipeline as pipeline
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    undo = []
    launch = KernelLauncher.launch

    def recorded_launch(self, *args, **kwargs):
        if _active is not None:
            fields = {k: _text(kwargs[k]) for k in ("grid", "block", "cluster", "smem") if kwargs.get(k) is not None}
            name = getattr(self.funcBody, "__qualname__", "kernel")
            _active.entries.append({"group": "launch", "stage": name, "kind": "launch", "fields": fields})
        return launch(self, *args, **kwargs)

    KernelLauncher.launch = recorded_launch
    undo.append(lambda: setattr(KernelLauncher, "launch", launch))
    for name in PIPELINES:
        cls = getattr(pipeline, name, None)
        if cls is None or "create" not in vars(cls):
            continue
        original = vars(cls)["create"]
        if isinstance(original, staticmethod):
            setattr(cls, "create", staticmethod(_recorded_create(name, original.__func__)))
        elif callable(original):  # a plain function called on the class
            setattr(cls, "create", _recorded_create(name, original))
        else:
            continue
        undo.append(lambda cls=cls, original=original: setattr(cls, "create", original))
    return undo


def _recorded_create(name: str, create):
    def wrapper(*args, **kwargs):
        if _active is not None:
            fields = {"stages": _text(kwargs.get("num_stages", "?"))}
            for role in ("producer", "consumer"):
                g = kwargs.get(f"{role}_group")
                if g is not None:
                    fields[f"{role} group"] = f"{str(g.agent).rsplit('.', 1)[-1]} x {_text(g.size)}"
            if "tx_count" in kwargs:
                fields["tx_count"] = _text(kwargs["tx_count"])
            _active.entries.append({"group": "pipelines", "stage": name, "kind": "created", "fields": fields})
        return create(*args, **kwargs)

    return wrapper


def _text(obj) -> str:
    import cutlass.cute as cute

    try:
        return cute.pretty_str(obj)
    except Exception:
        return str(obj)


def _attr(obj, name: str):
    """obj.name, or None where the object has no such attribute (or raises for it, as TMA
    coordinate tensors do for memspace): a recorder never breaks a trace."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _iterator_text(iterator) -> str:
    """ptr<dtype, space, align, swizzle>, a TMA coordinate basis, or the type of an IR value (an
    smem descriptor) rather than its printed operation."""
    text = str(iterator)
    if text.startswith("OpResult("):
        return str(_attr(iterator, "type") or text.rsplit("->", 1)[-1].strip(" )"))
    return text


def describe(obj) -> tuple[str, dict[str, str]]:
    """(kind, fields) for a CuTe object: tensors get their layout (shape:stride), dtype, memory and
    swizzle; layouts their printed form (with the swizzle of a composed one); tiled MMAs and copies
    their printed form (atoms, thread layouts, TV layouts); anything else its value."""
    layout, iterator = _attr(obj, "layout"), _attr(obj, "iterator")
    if layout is not None and iterator is not None:
        fields = {"layout": str(layout)}
        dtype = _attr(obj, "element_type")
        if isinstance(dtype, type):
            fields["dtype"] = str(dtype)
        memspace = _attr(obj, "memspace")
        if memspace is not None:
            fields["memory"] = str(memspace).rsplit(".", 1)[-1]
        fields["iterator"] = _iterator_text(iterator)
        swizzle = SWIZZLE.search(fields["iterator"] + fields["layout"])
        if swizzle:
            fields["swizzle"] = swizzle.group(0)
        return "tensor", fields
    if _attr(obj, "inner") is not None and _attr(obj, "outer") is not None:  # swizzle o offset o layout
        return "composed layout", {"layout": str(obj), "swizzle": str(obj.inner)}
    name = type(obj).__name__
    if "Mma" in name or "Copy" in name:
        return name, {"printed": str(obj)}
    if _attr(obj, "shape") is not None and _attr(obj, "stride") is not None:
        return "layout", {"layout": str(obj)}
    return name, {"value": _text(obj)}


def _caller_group(depth: int = 2) -> str:
    code = sys._getframe(depth).f_code
    return "host" if code.co_name == "__call__" else code.co_name


def record(stage: str, obj, group: str | None = None) -> None:
    """Print `obj` under `stage` in the `layouts` command (grouped by the calling function by default)."""
    if _active is None:
        return
    kind, fields = describe(obj)
    _active.entries.append({"group": group or _caller_group(), "stage": stage, "kind": kind, "fields": fields})


def _static_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mode_size(tensor, mode: int) -> int | None:
    import cutlass.cute as cute

    try:
        return _static_int(cute.size(tensor, mode=[mode]))
    except Exception:
        return None


def record_tma_slice(stage: str, tensor, coord: tuple, tile_mode: int, n_tiles: int | None = None,
                     group: str | None = None):
    """Slice a TMA-partitioned tensor with `coord` and return the slice (always, recording or not).

    `tile_mode` is the mode that walks the tiles the kernel loops over (the KV tiles). When that mode
    is pinned to a constant while more than one tile exists (`n_tiles`, else the mode's static size;
    dynamic counts as more than one), every TMA load reads the same tile: lint `tma-tile-mode`.
    """
    sliced = tensor[coord]
    if _active is not None:
        kind, fields = describe(tensor)
        fields["slice"] = _text(coord)
        fields["after slice"] = str(sliced.layout) if hasattr(sliced, "layout") else _text(sliced)
        _active.entries.append({"group": group or _caller_group(), "stage": stage, "kind": kind, "fields": fields})
        pinned = coord[tile_mode] if tile_mode < len(coord) else None
        _active.facts.append({
            "rule": "tma-tile-mode", "stage": stage, "coord": _text(coord), "tile_mode": tile_mode,
            "pinned": None if pinned is None else _text(pinned),
            "n_tiles": n_tiles if n_tiles is not None else _mode_size(tensor, tile_mode),
        })
    return sliced


def record_slice(stage: str, tensor, coord: tuple, group: str | None = None):
    """Slice `tensor` with `coord` and return the slice (always, recording or not); while recording,
    check every constant coordinate against its mode's static size (lint `slice-bounds`).

    CuTe accepts an index past the end of a size-1, stride-0 mode without a word (offset 0): a loop
    index aimed at the wrong mode then moves the whole fragment and predicates on the wrong element.
    Call it in a loop as often as needed: the stage is listed once, every call is checked.
    """
    sliced = tensor[coord]
    if _active is not None:
        import cutlass.cute as cute

        shape = cute.shape(tensor)
        group = group or _caller_group()
        if not any(e["group"] == group and e["stage"] == stage for e in _active.entries):
            kind, fields = describe(tensor)
            fields["slice"] = _text(coord)
            _active.entries.append({"group": group, "stage": stage, "kind": kind, "fields": fields})
        _active.facts.append({"rule": "slice-bounds", "stage": stage, "coord": _text(coord), "shape": _text(shape),
                              "out_of_range": list(_out_of_range(coord, shape, ()))})
    return sliced


def _out_of_range(coord, shape, path: tuple):
    """[mode path, index, static size] for each constant index outside its (static) mode."""
    if isinstance(coord, tuple):
        modes = shape if isinstance(shape, tuple) else (shape,)
        for i, c in enumerate(coord):
            yield from _out_of_range(c, modes[i] if i < len(modes) else 1, path + (i,))
    elif isinstance(coord, int) and not isinstance(coord, bool):
        size = _static_size(shape)
        if size is not None and not 0 <= coord < size:
            yield [list(path), coord, size]


def _static_size(shape) -> int | None:
    if isinstance(shape, tuple):
        sizes = [_static_size(s) for s in shape]
        return None if None in sizes else math.prod(sizes)
    return shape if isinstance(shape, int) else None


def _bytes(load) -> int | None:
    """Bytes of one load: an int, a smem tensor of one stage, or (dtype, layout)."""
    import cutlass.cute as cute

    if isinstance(load, int):
        return load
    dtype, layout = (load.element_type, load.layout) if hasattr(load, "element_type") else load
    return _static_int(cute.size_in_bytes(dtype, layout))


def record_barrier(stage: str, tx_count, loads: dict, group: str | None = None) -> None:
    """A TMA transaction barrier: the `tx_count` it was armed with and every load that lands on it
    in one stage (name -> int bytes | smem tensor | (dtype, layout)). Lint `tx-count`."""
    if _active is None:
        return
    sizes = {name: _bytes(v) for name, v in loads.items()}
    _active.entries.append({"group": group or _caller_group(), "stage": stage, "kind": "tma barrier",
                            "fields": {"tx_count": str(tx_count),
                                       "loads": ", ".join(f"{k} {v} B" for k, v in sizes.items())}})
    _active.facts.append({"rule": "tx-count", "stage": stage, "tx_count": _static_int(tx_count), "loads": sizes})


def record_pipeline(stage: str, pipeline, consumer_group, consumer_warps: int, multicast: int = 1,
                    group: str | None = None) -> None:
    """A pipeline (class or instance), its consumer CooperativeGroup (or the arrive count) and how many
    warps really consume it (times `multicast` CTAs). Lint `arrive-count`."""
    if _active is None:
        return
    cls = pipeline if isinstance(pipeline, type) else type(pipeline)
    count = getattr(consumer_group, "size", consumer_group)
    agent = getattr(consumer_group, "agent", None)
    _active.entries.append({"group": group or _caller_group(), "stage": stage, "kind": "pipeline",
                            "fields": {"class": cls.__name__, "consumer arrive count": str(count),
                                       "consumer agent": str(agent).rsplit(".", 1)[-1] if agent else "",
                                       "consumer warps": str(consumer_warps), "multicast": str(multicast)}})
    _active.facts.append({"rule": "arrive-count", "stage": stage, "pipeline": cls.__name__,
                          "count": _static_int(count), "warps": consumer_warps, "multicast": multicast})
