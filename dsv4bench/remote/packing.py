"""Pack the working tree: tracked files (with their uncommitted edits) plus untracked, non-ignored ones.

The tarball is deterministic (sorted names, zero mtimes and owners, normalized modes), so its
sha256 names it: a tree that did not change is recognised on the host and never re-sent.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path


class PackError(RuntimeError):
    """The tree cannot be packed (not a git checkout, unreadable file)."""


@dataclass(frozen=True)
class Pack:
    tree_id: str  # sha256 of the tarball
    data: bytes  # .tar.gz
    manifest: dict  # commit, dirty flag, file count


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise PackError(f"git failed in {root}: {e}") from None
    if out.returncode != 0:
        raise PackError(f"{root} is not a git checkout: {out.stderr.strip()}")
    return out.stdout


def list_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files that exist in the working tree, sorted."""
    names = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted({n for n in names if n and (root / n).is_file() and not (root / n).is_symlink()})


def pack_tree(root: str | Path) -> Pack:
    root = Path(_git(Path(root), "rev-parse", "--show-toplevel").strip())
    files = list_files(root)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in files:
            path = root / name
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o755 if path.stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(data))
    data = gzip.compress(raw.getvalue(), mtime=0)
    commit = _git(root, "rev-parse", "HEAD").strip()
    dirty = bool(_git(root, "status", "--porcelain").strip())
    manifest = {"commit": commit, "dirty": dirty, "files": len(files), "root": str(root)}
    return Pack(tree_id=hashlib.sha256(data).hexdigest()[:32], data=data, manifest=manifest)
