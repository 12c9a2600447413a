"""`dsv4bench cache ls|stats|warm|clear`: the persistent compiled-kernel cache (docs/cache.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dsv4bench.cli.common import console, fail, resolve_archs
from dsv4bench.cli.jsonout import JSON_OPTION, print_json
from dsv4bench.compile.cache import CompileCache
from dsv4bench.compile.fingerprint import fingerprint
from dsv4bench.compile.store import DiskStore, Unusable
from dsv4bench.core.registry import SweepOptions, families, get_family, impls

app = typer.Typer(no_args_is_help=True, help="The persistent compiled-kernel cache.")
DIR_HELP = "cache directory (default: $DSV4BENCH_CACHE_DIR/kernels, else ~/.cache/dsv4bench/kernels)"


def current_fingerprints() -> dict[tuple[str, str], str]:
    """(family, impl) -> the fingerprint its kernel sources have now."""
    return {(f, i.name): fingerprint(type(i).__module__) for f in families() for i in impls(f) if i.compiles}


def entry_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def existing_store(cache_dir: Optional[Path]) -> DiskStore:
    store = DiskStore(cache_dir)
    if not store.root.is_dir():
        fail(f"no kernel cache at {store.root}" + (" (not a directory)" if store.root.exists() else ""))
    return store


def check_family(family: Optional[str]) -> None:
    if family is not None:
        try:
            get_family(family)
        except KeyError as e:
            fail(e.args[0])


def entry_rows(store: DiskStore, family: Optional[str]) -> list[dict]:
    """One dict per cached kernel (the --json form of `cache ls`); an unreadable entry has only
    its family and impl directory names, its path and state "unreadable"."""
    now, rows = current_fingerprints(), []
    for path, meta in store.entries():
        if meta is None:
            rows.append({"family": path.parent.parent.name, "impl": path.parent.name, "path": str(path),
                         "state": "unreadable"})
            continue
        if family and meta["family"] != family:
            continue
        comp = meta["compile"]
        rows.append({"family": meta["family"], "impl": meta["impl"], "arch": meta["arch"],
                     "params": meta["case"]["params"], "bytes": entry_bytes(path),
                     "compile_seconds": comp["compile_seconds"], "registers": comp.get("registers"),
                     "lints": len(comp.get("lints") or []),
                     "state": "current" if now.get((meta["family"], meta["impl"])) == meta["fingerprint"] else "stale",
                     "age_hours": round((time.time() - meta["created"]) / 3600, 3), "path": str(path)})
    return rows


@app.command("ls")
def ls_cmd(family: Optional[str] = typer.Argument(None, help="only this kernel family"),
           cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP),
           as_json: bool = JSON_OPTION) -> None:
    """One row per cached kernel: what it is, its size and resources, and whether it is current."""
    check_family(family)
    store = existing_store(cache_dir)
    rows = entry_rows(store, family)
    if as_json:
        print_json({"root": str(store.root), "entries": rows})
        return
    table = Table(title=f"compiled kernels in {store.root}")
    for col in ("family", "impl", "arch", "built for case", "object", "compile s", "regs", "lints", "state", "age"):
        table.add_column(col)
    for r in rows:
        if r["state"] == "unreadable":
            table.add_row(r["family"], r["impl"], "", "", "", "", "", "", "[red]unreadable[/]", "")
            continue
        table.add_row(r["family"], r["impl"], r["arch"], " ".join(f"{k}={v}" for k, v in r["params"].items()),
                      f"{r['bytes'] / 1024:.0f} KiB", f"{r['compile_seconds']:.2f}", str(r["registers"] or ""),
                      str(r["lints"]), "current" if r["state"] == "current" else "[dim]stale[/]",
                      f"{r['age_hours']:.1f} h")
    console.print(table)
    console.print(f"{sum(r['state'] != 'unreadable' for r in rows)} entries")


def cache_stats(store: DiskStore) -> dict:
    """Entries, bytes and stored compile seconds per (family, impl, arch), the stale and unreadable
    counts and the store's counters (the --json form of `cache stats`)."""
    per: dict[tuple, dict] = {}
    stale = unreadable = 0
    for r in entry_rows(store, None):
        if r["state"] == "unreadable":
            unreadable += 1
            continue
        stale += r["state"] == "stale"
        group = per.setdefault((r["family"], r["impl"], r["arch"]), {
            "family": r["family"], "impl": r["impl"], "arch": r["arch"], "entries": 0, "bytes": 0,
            "compile_seconds": 0.0})
        group["entries"] += 1
        group["bytes"] += r["bytes"]
        group["compile_seconds"] += r["compile_seconds"] or 0.0
    counts = store.counters()
    return {"root": str(store.root), "groups": [per[k] for k in sorted(per)],
            "entries": sum(g["entries"] for g in per.values()), "stale": stale, "unreadable": unreadable,
            "counters": {k: counts.get(k, 0) for k in ("compiles", "disk_hits", "corrupt_rebuilt")}}


@app.command("stats")
def stats_cmd(cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP),
              as_json: bool = JSON_OPTION) -> None:
    """Entries, bytes and compile time saved per family and arch, plus hit / compile / corrupt counters."""
    stats = cache_stats(existing_store(cache_dir))
    if as_json:
        print_json(stats)
        return
    table = Table(title=f"kernel cache {stats['root']}")
    for col in ("family", "impl", "arch", "entries", "MiB", "compile s stored"):
        table.add_column(col)
    for g in stats["groups"]:
        table.add_row(g["family"], g["impl"], g["arch"], str(g["entries"]), f"{g['bytes'] / 2**20:.2f}",
                      f"{g['compile_seconds']:.1f}")
    console.print(table)
    c = stats["counters"]
    console.print(f"entries {stats['entries']} (stale {stats['stale']}, unreadable {stats['unreadable']}); "
                  f"compiles {c['compiles']}, disk hits {c['disk_hits']}, "
                  f"corrupt entries rebuilt {c['corrupt_rebuilt']}")


@app.command("warm")
def warm_cmd(
    family: Optional[str] = typer.Argument(None, help="kernel family (default: every family)"),
    arch: str = typer.Option("sm_90a,sm_100a", help="archs to compile for, e.g. sm_90a,sm_100a"),
    examples: int = typer.Option(0, min=0, help="hypothesis-drawn cases to add to the production grid"),
    seed: int = typer.Option(0, help="seed of the drawn cases"),
    cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP),
) -> None:
    """Compile a family's case space for the given archs into the cache (no GPU needed)."""
    check_family(family)
    archs = resolve_archs(arch)
    store = DiskStore(cache_dir)
    try:
        store.open()
    except Unusable as e:
        fail(f"cannot warm {store.root}: {e}")
    cache = CompileCache(store=store, use_disk=True)
    work = []
    for fam in [family] if family else sorted(families()):
        cases = get_family(fam).cases(SweepOptions(examples=examples, seed=seed))
        for impl in (i for i in impls(fam) if i.compiles):
            work += [(impl, c, a) for c in cases for a in archs if a in impl.archs and not impl.supports(c, a)]
    counts: dict[str, int] = {}
    failures = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("warming", total=len(work))
        for impl, case, a in work:
            try:
                _, info = cache.get(impl, case, a)
                counts[info.cache] = counts.get(info.cache, 0) + 1
                if info.lints:
                    progress.console.print(f"[yellow]lint[/] {case.id} {impl.name} {a}: {info.lints[0]}")
            except Exception as e:
                failures.append(f"{case.id} {impl.family}/{impl.name} {a}: {type(e).__name__}: {str(e)[:200]}")
                progress.console.print(f"[red]FAIL_COMPILE[/] {failures[-1]}", highlight=False)
            progress.advance(bar)
    console.print(f"{len(work)} kernels for {','.join(archs)} in {cache.store.root}: compiled {cache.compiles}, "
                  f"already cached {counts.get('disk', 0)}, same kernel as another case {counts.get('memory', 0)}, "
                  f"failed {len(failures)}")
    raise typer.Exit(1 if failures else 0)


@app.command("clear")
def clear_cmd(family: Optional[str] = typer.Argument(None, help="only this kernel family"),
              stale: bool = typer.Option(False, "--stale", help="only entries whose kernel sources changed"),
              cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Delete cached kernels (all, one family's, or the stale ones)."""
    check_family(family)
    store = existing_store(cache_dir)
    now = current_fingerprints() if stale else {}
    removed = freed = 0
    for path, meta in list(store.entries()):
        if meta is not None and family and meta["family"] != family:
            continue
        if stale and meta is not None and now.get((meta["family"], meta["impl"])) == meta["fingerprint"]:
            continue
        try:
            with store.lock(path):
                size = entry_bytes(path)
                store.remove(path)
        except Unusable as e:
            fail(f"cannot clear {store.root}: {e}")
        freed += size
        removed += 1
    console.print(f"removed {removed} entries ({freed / 2**20:.2f} MiB) from {store.root}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="cache")
