"""`dsv4bench cache ls|stats|warm|clear`: the persistent compiled-kernel cache (docs/cache.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dsv4bench.cli.common import console, fail, resolve_archs
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


@app.command("ls")
def ls_cmd(family: Optional[str] = typer.Argument(None, help="only this kernel family"),
           cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """One row per cached kernel: what it is, its size and resources, and whether it is current."""
    check_family(family)
    store, now = existing_store(cache_dir), current_fingerprints()
    table = Table(title=f"compiled kernels in {store.root}")
    for col in ("family", "impl", "arch", "built for case", "object", "compile s", "regs", "lints", "state", "age"):
        table.add_column(col)
    rows = 0
    for path, meta in store.entries():
        if meta is None:
            table.add_row(path.parent.parent.name, path.parent.name, "", "", "", "", "", "", "[red]unreadable[/]", "")
            continue
        if family and meta["family"] != family:
            continue
        comp = meta["compile"]
        state = "current" if now.get((meta["family"], meta["impl"])) == meta["fingerprint"] else "[dim]stale[/]"
        params = " ".join(f"{k}={v}" for k, v in meta["case"]["params"].items())
        table.add_row(meta["family"], meta["impl"], meta["arch"], params, f"{entry_bytes(path) / 1024:.0f} KiB",
                      f"{comp['compile_seconds']:.2f}", str(comp.get("registers") or ""),
                      str(len(comp.get("lints") or [])), state, f"{(time.time() - meta['created']) / 3600:.1f} h")
        rows += 1
    console.print(table)
    console.print(f"{rows} entries")


@app.command("stats")
def stats_cmd(cache_dir: Optional[Path] = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Entries, bytes and compile time saved per family and arch, plus hit / compile / corrupt counters."""
    store, now = existing_store(cache_dir), current_fingerprints()
    per: dict[tuple, list] = {}
    stale = unreadable = 0
    for path, meta in store.entries():
        if meta is None:
            unreadable += 1
            continue
        stale += now.get((meta["family"], meta["impl"])) != meta["fingerprint"]
        row = per.setdefault((meta["family"], meta["impl"], meta["arch"]), [0, 0, 0.0])
        row[0] += 1
        row[1] += entry_bytes(path)
        row[2] += meta["compile"]["compile_seconds"] or 0.0
    table = Table(title=f"kernel cache {store.root}")
    for col in ("family", "impl", "arch", "entries", "MiB", "compile s stored"):
        table.add_column(col)
    for (fam, imp, arch), (n, size, secs) in sorted(per.items()):
        table.add_row(fam, imp, arch, str(n), f"{size / 2**20:.2f}", f"{secs:.1f}")
    console.print(table)
    counts = store.counters()
    total = sum(r[0] for r in per.values())
    console.print(f"entries {total} (stale {stale}, unreadable {unreadable}); "
                  f"compiles {counts.get('compiles', 0)}, disk hits {counts.get('disk_hits', 0)}, "
                  f"corrupt entries rebuilt {counts.get('corrupt_rebuilt', 0)}")


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
