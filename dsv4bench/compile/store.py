"""On-disk store of compiled kernels: one directory per entry, written atomically, verified on read.

    <root>/<family>/<impl>/<entry id>/meta.json      key, fingerprint, versions, compile info,
                                                     recorded layouts, sha256 + size of each payload
                                     kernel.o         the TVM-FFI object (loads without JIT)
                                     kernel.cubin     (and kernel.ptx when kept)
    <root>/<family>/<impl>/<entry id>.lock           fcntl lock: one writer per entry, readers wait
    <root>/stats.json                                counters shared by every process

An entry is built in a temporary directory and renamed into place, so readers see all of it or
none of it. Nothing read back is trusted: a payload whose size or sha256 differs from its metadata,
or unreadable metadata, raises CorruptEntry; the caller deletes the entry and rebuilds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

META = "meta.json"
STATS = "stats.json"
ENV_DIR = "DSV4BENCH_CACHE_DIR"


def default_root() -> Path:
    base = os.environ.get(ENV_DIR)
    return (Path(base) if base else Path.home() / ".cache" / "dsv4bench") / "kernels"


class CorruptEntry(Exception):
    """An entry on disk that fails verification; the message says what failed."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class DiskStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_root()

    def entry(self, family: str, impl: str, entry_id: str) -> Path:
        return self.root / family / impl / entry_id

    def lock(self, entry: Path):
        return file_lock(entry.with_name(entry.name + ".lock"))

    def read(self, entry: Path) -> tuple[dict, dict[str, Path]] | None:
        """(metadata, payload name -> verified path), None when absent; CorruptEntry when wrong."""
        meta_path = entry / META
        if not meta_path.exists():
            if entry.exists():
                raise CorruptEntry("metadata missing")
            return None
        try:
            meta = json.loads(meta_path.read_text())
            payloads = meta["payloads"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptEntry(f"unreadable metadata ({type(e).__name__})") from None
        paths = {}
        for name, want in payloads.items():
            path = entry / name
            try:
                data = path.read_bytes()
            except OSError:
                raise CorruptEntry(f"{name} missing") from None
            if len(data) != want["bytes"]:
                raise CorruptEntry(f"{name} is {len(data)} B, expected {want['bytes']} B")
            if sha256(data) != want["sha256"]:
                raise CorruptEntry(f"{name} sha256 mismatch")
            paths[name] = path
        return meta, paths

    def write(self, entry: Path, payloads: dict[str, bytes], meta: dict) -> None:
        """Build the entry beside its final place, then rename it in (replacing any old one)."""
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        try:
            for name, data in payloads.items():
                (tmp / name).write_bytes(data)
            meta = {**meta, "payloads": {n: {"bytes": len(d), "sha256": sha256(d)} for n, d in payloads.items()}}
            (tmp / META).write_text(json.dumps(meta, indent=1, default=str))
            for path in tmp.iterdir():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            self.remove(entry)
            os.replace(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, entry: Path) -> None:
        shutil.rmtree(entry, ignore_errors=True)

    def entries(self):
        """(entry dir, metadata or None when unreadable) for every entry, family/impl order."""
        for meta_path in sorted(self.root.glob(f"*/*/*/{META}")):
            if meta_path.parent.name.startswith("."):  # an entry being written
                continue
            try:
                yield meta_path.parent, json.loads(meta_path.read_text())
            except (OSError, ValueError):
                yield meta_path.parent, None

    def bump(self, counter: str, by: int = 1) -> None:
        path = self.root / STATS
        with file_lock(self.root / (STATS + ".lock")):
            counts = self.counters()
            counts[counter] = counts.get(counter, 0) + by
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(counts))
            os.replace(tmp, path)

    def counters(self) -> dict[str, int]:
        try:
            return json.loads((self.root / STATS).read_text())
        except (OSError, ValueError):
            return {}
