"""Lints over recorded layout facts: the seed notes' costliest silent bugs, caught at compile time.

tma-tile-mode  a TMA-partitioned tensor sliced so that its tile mode (the KV tiles) is pinned to a
               constant while more than one tile exists: every load reads tile 0, the output is
               plausible and wrong (the (None,None,0,0) slice).
tx-count       a TMA barrier armed with a byte count that differs from the bytes of all loads that
               land on it in one stage (the missing-V deadlock).
arrive-count   a pipeline's consumer arrive count in the wrong unit: warps where every consumer
               thread arrives (PipelineAsync, PipelineCpAsync, PipelineUmmaAsync) or threads
               where one lane per warp arrives (PipelineTmaAsync).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.trace import Recording

# How many arrivals each consumer warp makes on the empty barrier, per pipeline class.
ARRIVES_PER_WARP = {"PipelineAsync": 32, "PipelineCpAsync": 32, "PipelineUmmaAsync": 32, "PipelineTmaAsync": 1}


@dataclass(frozen=True)
class Finding:
    rule: str
    stage: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule} [{self.stage}]: {self.message}"


def tma_tile_mode(f: dict) -> str | None:
    if f["pinned"] is None:
        return None
    n = f["n_tiles"]
    if n is not None and n <= 1:
        return None
    tiles = "a dynamic number of" if n is None else str(n)
    return (f"slice {f['coord']} pins mode {f['tile_mode']} (the tile mode, {tiles} tiles) to {f['pinned']}: "
            f"every TMA load reads the same tile; keep mode {f['tile_mode']} free and index it per tile")


def tx_count(f: dict) -> str | None:
    total = sum(v for v in f["loads"].values() if v is not None)
    if f["tx_count"] is None or None in f["loads"].values() or f["tx_count"] == total:
        return None
    parts = " + ".join(f"{k} {v}" for k, v in f["loads"].items())
    effect = "the phase never completes (deadlock)" if f["tx_count"] > total else \
        "the tx count underflows when the last load lands (deadlock or a race)"
    return f"tx_count {f['tx_count']} B but the loads of one stage bring {total} B ({parts}): {effect}"


def arrive_count(f: dict) -> str | None:
    per_warp = ARRIVES_PER_WARP.get(f["pipeline"])
    if per_warp is None or f["count"] is None:
        return None
    expected = f["warps"] * f["multicast"] * per_warp
    if f["count"] == expected:
        return None
    unit = "threads" if per_warp == 32 else "warps (one signalling lane each)"
    hint = ""
    if per_warp == 32 and f["count"] == f["warps"] * f["multicast"]:
        hint = "given in warps instead of threads; "
    elif per_warp == 1 and f["count"] == 32 * f["warps"] * f["multicast"]:
        hint = "given in threads instead of warps; "
    return (f"{f['pipeline']} consumer arrive count {f['count']}, but {f['warps']} consumer warps x "
            f"{f['multicast']} CTA arrive {expected} times per phase (counted in {unit}): {hint}"
            f"phases complete early or never")


def slice_bounds(f: dict) -> str | None:
    if not f["out_of_range"]:
        return None
    path, index, size = f["out_of_range"][0]
    return (f"slice {f['coord']} of a tensor shaped {f['shape']} indexes mode {tuple(path)} (size {size}) at "
            f"{index}: CuTe reads past a size-1 stride-0 mode at offset 0 without complaint, so this selects the "
            f"wrong data; index the mode that holds the values")


SERIALIZED_HINTS = {
    "C7520": "a wgmma (or its warpgroup.fence) sits under a runtime branch; issue it unconditionally "
             "(peel the loop iteration that skips it, docs/lessons/fmha.md)",
    "C7514": "non-wgmma instructions read a wgmma's accumulator before its wait_group; wait before touching it",
}


def wgmma_serialized(f: dict) -> str | None:
    if not f.get("serialized"):
        return None
    first = f["serialized"][0]
    codes = sorted({m["code"] for m in f["serialized"]})
    fn = first["function"]
    where = f" in {fn[:72]}{'...' if len(fn) > 72 else ''}" if fn else ""
    hint = SERIALIZED_HINTS.get(first["code"], "see the ptxas message")
    return (f"ptxas {'/'.join(codes)}: {first['message']}{where}: every wgmma of the kernel waits for the one "
            f"before (no MMA overlap, silently slower); {hint}")


RULES = {"tma-tile-mode": tma_tile_mode, "tx-count": tx_count, "arrive-count": arrive_count,
         "slice-bounds": slice_bounds, "wgmma-serialized": wgmma_serialized}


def lint(rec: Recording) -> list[Finding]:
    out = []
    for fact in rec.facts:
        message = RULES[fact["rule"]](fact)
        if message:
            out.append(Finding(fact["rule"], fact["stage"], message))
    return out
