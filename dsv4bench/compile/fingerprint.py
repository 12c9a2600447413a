"""Source fingerprint of a kernel: what must change the key of a cached compiled kernel.

The impl's module plus every module of the `kernels` package it imports, transitively (found by
walking `import` / `from ... import` statements with ast, relative ones included), hashed by file
content; plus the cutlass-dsl, tvm-ffi and Python versions and this cache's format version.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

ROOT_PACKAGE = "kernels"
FORMAT_VERSION = 3  # 3: entries signed with the user key (older ones show as stale)


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _imports(path: Path, module: str) -> set[str]:
    """Modules (and `from X import name` candidates X.name) that `path` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _in_scope(module: str) -> bool:
    return module == ROOT_PACKAGE or module.startswith(ROOT_PACKAGE + ".")


def source_files(module: str) -> dict[str, Path]:
    """`module`'s file and every kernels/ module it reaches through imports (packages' __init__ too),
    by module name."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _origin(name)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if _in_scope(".".join(parts[:i]))]
        todo += [m for m in _imports(path, name) if _in_scope(m)]
    return dict(sorted(seen.items()))


def versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"

    return {"cutlass-dsl": version("nvidia-cutlass-dsl"), "tvm-ffi": version("apache-tvm-ffi"),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}", "format": str(FORMAT_VERSION)}


@lru_cache(maxsize=None)
def fingerprint(module: str) -> str:
    """sha256 over the versions and the source files of `module` (cached for the process)."""
    h = hashlib.sha256()
    for k, v in sorted(versions().items()):
        h.update(f"{k}={v}\n".encode())
    for name, path in source_files(module).items():
        h.update(f"{name}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
