"""On-disk store of compiled kernels: one directory per entry, written atomically, signed, verified on read.

    <root>/<family>/<impl>/<entry id>/meta.json      identity (family, impl, arch, key, fingerprint),
                                                     versions, compile info, recorded layouts, sha256
                                                     + size of each payload, HMAC of all of it
                                     kernel.o         the TVM-FFI object (loads without JIT)
                                     kernel.cubin     (and kernel.ptx when kept)
    <root>/<family>/<impl>/<entry id>.lock           fcntl lock: one writer per entry, readers wait
    <root>/stats.json                                counters shared by every process

Trust (docs/cache.md): the directory is made owner-only and refused when every user may write it;
the metadata is signed with HMAC-SHA256 under a per-user secret kept outside the cache (`key_path`),
and it holds the sha256 of every payload, so an entry is loaded only when it was written by this
user's key for exactly the kernel asked for. Anything else raises CorruptEntry (the caller deletes
and rebuilds the entry); a directory or key that cannot be used raises Unusable. Verified payloads
are handed to the loader as private copies, so what is loaded is what was verified.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

META = "meta.json"
STATS = "stats.json"
MAC = "hmac"
ENV_DIR = "DSV4BENCH_CACHE_DIR"
ENV_KEY = "DSV4BENCH_CACHE_KEY"
KEY_BYTES = 32


def default_root() -> Path:
    base = os.environ.get(ENV_DIR)
    return (Path(base) if base else Path.home() / ".cache" / "dsv4bench") / "kernels"


def key_path() -> Path:
    """This user's cache key: $DSV4BENCH_CACHE_KEY, else $XDG_CONFIG_HOME/dsv4bench/cache.key, else
    ~/.config/dsv4bench/cache.key; never inside the cache directory, which may be shared."""
    if os.environ.get(ENV_KEY):
        return Path(os.environ[ENV_KEY])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "dsv4bench" / "cache.key"


class CorruptEntry(Exception):
    """An entry on disk that fails verification; the message says what failed."""


class Unusable(Exception):
    """The cache directory or the key cannot be used (unwritable, writable by everyone, not private):
    one line saying why."""


def reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def signature(key: bytes, meta: dict) -> str:
    """HMAC-SHA256 of the metadata (the payloads' digests included), its own field left out."""
    body = json.dumps({k: v for k, v in meta.items() if k != MAC}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def user_key(path: Path) -> bytes:
    """The secret at `path`, made (random, mode 0600) on first use; Unusable when it cannot be made or read,
    or another user could read or replace it."""
    try:
        if not path.exists():
            _make_key(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            text = f.read().strip()
    except OSError as e:
        raise Unusable(f"cache key {path}: {reason(e)}") from None
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise Unusable(f"cache key {path} is not private to this user (mode {stat.S_IMODE(st.st_mode):o}): "
                       f"chmod 600 it, or delete it to make a new one")
    try:
        key = bytes.fromhex(text.decode())
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise Unusable(f"cache key {path} is damaged: delete it to make a new one")
    return key


def _make_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
        try:
            os.link(tmp, path)  # atomic, and never replaces a key another process made meanwhile
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def locked(path: Path):
    """Open `path` (made if missing) and hold an exclusive fcntl lock on it until the returned file is
    closed (`with locked(p): ...`); Unusable when it cannot be opened."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError as e:
        raise Unusable(f"cannot lock {path.name} ({reason(e)})") from None
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


class DiskStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_root()
        self._key: bytes | None = None

    def open(self) -> bytes:
        """Make sure the directory can be trusted (created owner-only; refused when every user may write
        to it, unless it is sticky and ours) and load this user's key; once. Unusable otherwise."""
        if self._key is None:
            try:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                st = self.root.stat()
            except FileExistsError:
                raise Unusable("the cache directory is a file") from None
            except OSError as e:
                raise Unusable(f"cannot create the cache directory ({reason(e)})") from None
            if st.st_mode & stat.S_IWOTH and not (st.st_mode & stat.S_ISVTX and st.st_uid == os.geteuid()):
                raise Unusable("every user may write to the cache directory, so its kernels cannot be trusted "
                               "(chmod 700 it, or set DSV4BENCH_CACHE_DIR)")
            self._key = user_key(key_path())
        return self._key

    def entry(self, family: str, impl: str, entry_id: str) -> Path:
        return self.root / family / impl / entry_id

    def lock(self, entry: Path):
        return locked(entry.with_name(entry.name + ".lock"))

    def read(self, entry: Path, identity: dict) -> tuple[dict, dict[str, bytes]] | None:
        """(metadata, payload name -> verified bytes), None when absent. CorruptEntry when the entry is not
        signed with this user's key, is not the kernel `identity` describes, or a payload differs."""
        key = self.open()
        meta_path = entry / META
        if not meta_path.exists():
            if entry.exists():
                raise CorruptEntry("metadata missing")
            return None
        try:
            meta = json.loads(meta_path.read_text())
            payloads, mac = meta["payloads"], str(meta[MAC])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptEntry(f"unreadable or unsigned metadata ({type(e).__name__})") from None
        if not hmac.compare_digest(mac, signature(key, meta)):
            raise CorruptEntry("not signed with this user's cache key")
        differs = [k for k, v in identity.items() if meta.get(k) != v]
        if differs:
            raise CorruptEntry(f"holds another kernel: its {', '.join(differs)} differs from the request")
        blobs = {}
        for name, want in payloads.items():
            try:
                data = (entry / name).read_bytes()
            except OSError:
                raise CorruptEntry(f"{name} missing") from None
            if len(data) != want["bytes"]:
                raise CorruptEntry(f"{name} is {len(data)} B, expected {want['bytes']} B")
            if sha256(data) != want["sha256"]:
                raise CorruptEntry(f"{name} sha256 mismatch")
            blobs[name] = data
        return meta, blobs

    @contextmanager
    def checkout(self, entry: Path, identity: dict):
        """`read`, with the verified payloads written to a private temporary directory for the loader:
        (metadata, payload name -> path), or None when absent."""
        found = self.read(entry, identity)
        if found is None:
            yield None
            return
        meta, blobs = found
        with tempfile.TemporaryDirectory(prefix="dsv4bench-load-") as tmp:
            paths = {name: Path(tmp) / name for name in blobs}
            for name, data in blobs.items():
                paths[name].write_bytes(data)
            yield meta, paths

    def write(self, entry: Path, payloads: dict[str, bytes], meta: dict) -> None:
        """Sign and build the entry beside its final place, then rename it in (replacing any old one);
        Unusable when it cannot be written."""
        meta = json.loads(json.dumps(  # what reading it back gives: the signature is over exactly that
            {**meta, "payloads": {n: {"bytes": len(d), "sha256": sha256(d)} for n, d in payloads.items()}},
            default=str))
        meta[MAC] = signature(self.open(), meta)
        try:
            entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        except OSError as e:
            raise Unusable(f"cannot write {entry.name} ({reason(e)})") from None
        try:
            for name, data in payloads.items():
                (tmp / name).write_bytes(data)
            (tmp / META).write_text(json.dumps(meta, indent=1))
            for path in tmp.iterdir():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            self.remove(entry)
            os.replace(tmp, entry)
        except OSError as e:
            raise Unusable(f"cannot write {entry.name} ({reason(e)})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, entry: Path) -> None:
        """Delete an entry (nothing when absent); Unusable when it cannot be deleted."""
        try:
            shutil.rmtree(entry)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise Unusable(f"cannot remove {entry.name} ({reason(e)})") from None

    def entries(self):
        """(entry dir, metadata or None when unreadable) for every entry, family/impl order."""
        for meta_path in sorted(self.root.glob(f"*/*/*/{META}")):
            if meta_path.parent.name.startswith("."):  # an entry being written
                continue
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                meta = None
            yield meta_path.parent, meta if isinstance(meta, dict) else None

    def bump(self, counter: str, by: int = 1) -> None:
        path = self.root / STATS
        try:
            with locked(self.root / (STATS + ".lock")):
                counts = self.counters()
                counts[counter] = counts.get(counter, 0) + by
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(counts))
                os.replace(tmp, path)
        except OSError as e:
            raise Unusable(f"cannot update {STATS} ({reason(e)})") from None

    def counters(self) -> dict[str, int]:
        """The shared counters; empty when the file is missing or not a table of counts (it is rewritten)."""
        try:
            counts = json.loads((self.root / STATS).read_text())
        except (OSError, ValueError):
            return {}
        ok = isinstance(counts, dict) and all(isinstance(v, int) for v in counts.values())
        return counts if ok else {}
