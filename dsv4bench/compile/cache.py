"""Compiled-kernel cache used by the worker, `repro` and `cache warm`: memory, then disk, then compile.

`CompileCache.get(impl, case, arch)` returns the compiled function plus a CompileInfo: seconds spent
getting it now, resources from the cubin, the lint findings over the layouts recorded while it was
traced, and where it came from: "miss" (compiled now), "memory" (reused in this process), "disk"
(loaded from the persistent store, no JIT) or "rebuilt" (the stored entry failed verification and
was compiled again; reported once on stderr and counted in `dsv4bench cache stats`).

The disk key is the impl's compile key (family, impl, arch, dtypes, compile-time parameters) plus the
source fingerprint of its kernel modules and the library versions (compile/fingerprint.py); an entry
is loaded only when its signed metadata names exactly that key (compile/store.py). A disk store that
cannot be used (unwritable, writable by every user, no key) is reported once on stderr and the
kernels are compiled without storing. DSV4BENCH_NO_KERNEL_CACHE=1 turns the disk off (cold-compile
timing); DSV4BENCH_CACHE_DIR moves it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from dsv4bench.compile import ptxas
from dsv4bench.compile.artifacts import artifact, compiled_functions, export, load
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.compile.fingerprint import fingerprint, versions
from dsv4bench.compile.lints import lint
from dsv4bench.compile.store import CorruptEntry, DiskStore, Unusable
from kernels import common as kernel_common
from kernels.trace import Recording, recording

# The harness's compile policy: keep the PTX wherever the ptxas lint can read it.
kernel_common.POLICY.keep_ptx = ptxas.keep_ptx

ENV_NO_CACHE = "DSV4BENCH_NO_KERNEL_CACHE"


@dataclass
class CompileInfo:
    seconds: float  # spent getting the kernel now: compile + export, a disk load, 0 from memory
    cache: str  # miss | memory | disk | rebuilt
    cubin_bytes: int | None = None
    registers: int | None = None
    local_bytes: int | None = None
    static_smem_bytes: int | None = None
    compile_seconds: float | None = None  # what the JIT took when the kernel was built
    lints: list[str] = field(default_factory=list)
    note: str = ""
    ptxas: str = ""  # the wgmma-serialized check: ok (s) and ptxas notes (C7519 ...), or why it was skipped

    def to_json(self) -> dict:
        return asdict(self)


def _most(values):
    """The largest of the known values (a cubin's registers or local memory may be unknown: None)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def describe(compiled, seconds: float, cache: str) -> CompileInfo:
    """The resources of a compile's cubins; of a dispatcher's several, the total size and the most
    registers, local and static shared memory of any one."""
    infos = [parse_cubin(c) for c in map(artifact, compiled_functions(compiled)) if c]
    if not infos:
        return CompileInfo(seconds, cache, compile_seconds=seconds)
    return CompileInfo(seconds, cache, sum(i.cubin_bytes for i in infos), _most(i.registers for i in infos),
                       _most(i.local_bytes for i in infos), max(i.static_smem_bytes for i in infos),
                       compile_seconds=seconds)


def compile_recorded(impl, case, arch: str):
    """Compile under the layout recorder, then run ptxas on the kept PTX (compile/ptxas.py; its
    result is the Recording's `wgmma-serialized` fact): (compiled, Recording, seconds). `seconds`
    is the compile alone; the ptxas check's own time is in the fact."""
    with recording() as rec:
        t0 = time.perf_counter()
        compiled = impl.compile(case, arch)
        seconds = time.perf_counter() - t0
    fact = ptxas.check(compiled, arch)
    if fact is not None:
        rec.facts.append(fact)
        for line in ptxas.notes(fact):
            print(f"dsv4bench: {impl.family} {impl.name} {arch}: note: {line}", file=sys.stderr, flush=True)
    return compiled, rec, seconds


def ptxas_fact(rec: Recording) -> dict | None:
    return next((f for f in rec.facts if f["rule"] == ptxas.RULE), None)


def identity(impl, arch: str, key: tuple) -> dict:
    """What a disk entry must say it holds to be loaded for this request (stored in its signed metadata)."""
    return {"family": impl.family, "impl": impl.name, "arch": arch, "key": repr(key),
            "fingerprint": fingerprint(type(impl).__module__)}


def entry_id(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


class CompileCache:
    def __init__(self, store: DiskStore | None = None, use_disk: bool | None = None):
        if use_disk is None:
            use_disk = os.environ.get(ENV_NO_CACHE, "") not in ("1", "true", "yes")
        self.store = (store or DiskStore()) if use_disk else None
        self.problem: str | None = None  # why the disk store is unusable: reported once, then left alone
        self._mem: dict[tuple, tuple[object, CompileInfo]] = {}
        self.compiles = 0  # JIT compiles done by this cache

    def get(self, impl, case, arch: str) -> tuple[object, CompileInfo]:
        key = impl.compile_key(case, arch)
        if key in self._mem:
            compiled, info = self._mem[key]
            return compiled, replace(info, seconds=0.0, cache="memory", note="")
        if impl.compiles and self.disk_ready():
            compiled, info = self._through_disk(impl, case, arch, key)
        else:
            compiled, info = self._unstored(impl, case, arch)
        self._mem[key] = (compiled, info)
        return compiled, info

    def disk_ready(self) -> bool:
        """Whether kernels go through the disk store (opened on the first call). An unusable one is
        reported once on stderr; kernels are then compiled without storing."""
        return self.store is not None and self._disk(self.store.open) is not None

    def _disk(self, step, *args):
        """A store step's result; None, and the one warning, when the store turns out unusable."""
        if self.problem is None:
            try:
                return step(*args)
            except Unusable as e:
                self.problem = str(e)
                print(f"dsv4bench cache: {self.store.root}: {e}; compiling without storing kernels",
                      file=sys.stderr, flush=True)
        return None

    def _compile(self, impl, case, arch, cache: str):
        compiled, rec, seconds = compile_recorded(impl, case, arch)
        self.compiles += 1
        info = describe(compiled, seconds, cache)
        info.lints = [str(f) for f in lint(rec)]
        info.ptxas = ptxas.summary(ptxas_fact(rec))
        return compiled, info, rec

    def _unstored(self, impl, case, arch):
        compiled, info, _ = self._compile(impl, case, arch, "miss")
        if impl.compiles and self.problem:
            not_stored(info, self.problem)
        return compiled, info

    def _through_disk(self, impl, case, arch, key):
        ident = identity(impl, arch, key)
        entry = self.store.entry(impl.family, impl.name, entry_id(ident))
        held = self._disk(self.store.lock, entry)  # held from the lookup to the store: one compile per kernel
        if held is None:
            return self._unstored(impl, case, arch)
        with held:
            t0 = time.perf_counter()
            found, note = self._load(entry, ident)
            if found:
                kernel, meta = found
                self._disk(self.store.bump, "disk_hits")
                return kernel, self._info_from(meta, time.perf_counter() - t0)
            compiled, info, rec = self._compile(impl, case, arch, "rebuilt" if note else "miss")
            info.note = note
            self._keep(entry, ident, case, compiled, info, rec)
            info.seconds = time.perf_counter() - t0  # what this get cost: compile + export + write
            return compiled, info

    def _load(self, entry, ident) -> tuple[tuple | None, str]:
        """((kernel, metadata) of the verified entry, or None when absent or bad; the note of a bad one,
        which is reported once, deleted and counted)."""
        try:
            with self.store.checkout(entry, ident) as found:
                if found is None:
                    return None, ""
                meta, paths = found
                return (load(paths, meta["artifact"]), meta), ""
        except Exception as e:  # verification failed, or the object would not load
            why = str(e) if isinstance(e, CorruptEntry) else f"load failed: {type(e).__name__}: {e}"
            note = f"corrupt cache entry rebuilt ({why})"
            print(f"dsv4bench cache: {entry}: {note}", file=sys.stderr, flush=True)
            self._disk(self.store.remove, entry)
            self._disk(self.store.bump, "corrupt_rebuilt")
            return None, note

    def _keep(self, entry, ident, case, compiled, info, rec) -> None:
        """Export and store the kernel; why it was not stored goes into info.note."""
        if self.problem:
            return not_stored(info, self.problem)
        try:
            payloads, layout = export(compiled, f"dsv4bench_{entry.name[:16]}")  # one symbol per kernel
        except Exception as e:  # not exportable: memory only
            return not_stored(info, f"{type(e).__name__}: {str(e)[:120]}")
        self._disk(self.store.write, entry, payloads, {
            **ident, "case": case.to_json(), "versions": versions(), "artifact": layout,
            "compile": info.to_json(), "recording": rec.to_json(), "created": time.time(),
        })
        if self.problem:
            return not_stored(info, self.problem)
        self._disk(self.store.bump, "compiles")

    @staticmethod
    def _info_from(meta: dict, seconds: float) -> CompileInfo:
        known = set(CompileInfo.__dataclass_fields__)
        stored = {k: v for k, v in meta["compile"].items() if k in known}
        rec = Recording.from_json(meta.get("recording", {}))
        return replace(CompileInfo(**stored), seconds=seconds, cache="disk", note="",
                       lints=[str(f) for f in lint(rec)])


def not_stored(info: CompileInfo, why: str) -> None:
    info.note = "; ".join(n for n in (info.note, f"not stored: {why}") if n)
