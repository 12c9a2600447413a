"""The compiled-kernel cache trusts nothing it finds (issue #27, defect 5): an entry of another kernel
copied over this one's, a crafted object with matching digests and an entry signed with another user's
key are rebuilt and never loaded; a cache every user may write is refused; a cache that cannot be
written compiles without storing, with one warning; the `cache` commands say what is wrong in one line."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from dsv4bench.cli.main import main
from dsv4bench.compile import cache as cache_module
from dsv4bench.compile.artifacts import OBJECT
from dsv4bench.compile.cache import CompileCache, entry_id, identity
from dsv4bench.compile.store import ENV_DIR, ENV_KEY, META, STATS, DiskStore, sha256
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl
from tests.core.helpers import ROOT, cli_env

IMPL = get_impl("rmsnorm", "cutedsl")
ARCH = "sm_90a"
NARROW, WIDE = (Case("rmsnorm", {"m": 64, "n": n, "dtype": "bf16", "weight": True}) for n in (512, 1024))


@pytest.fixture(autouse=True)
def user_key(tmp_path, monkeypatch):
    """This test's own user key, outside its cache directory."""
    path = tmp_path / "config" / "cache.key"
    monkeypatch.setenv(ENV_KEY, str(path))
    return path


@pytest.fixture
def loads(monkeypatch):
    """Every object the cache hands to the loader."""
    seen = []

    def spy(paths, layout):
        seen.append(paths[OBJECT].read_bytes())
        return real(paths, layout)

    real = cache_module.load
    monkeypatch.setattr(cache_module, "load", spy)
    return seen


def fresh_get(store, case=NARROW):
    """What a new process sees: no memory cache, the same disk (the directory checked, the key read again)."""
    return CompileCache(store=DiskStore(store.root), use_disk=True).get(IMPL, case, ARCH)


def entry_of(store, case):
    return store.entry(IMPL.family, IMPL.name, entry_id(identity(IMPL, ARCH, IMPL.compile_key(case, ARCH))))


def cache_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dsv4bench cache:")]


@pytest.fixture
def two_entries(tmp_path):
    store = DiskStore(tmp_path / "kernels")
    infos = {case.params["n"]: fresh_get(store, case)[1] for case in (NARROW, WIDE)}
    assert infos[512].registers != infos[1024].registers  # two different kernels
    return store, infos


def test_an_entry_copied_over_another_kernels_is_rebuilt_with_its_own_key(two_entries, loads, capsys):
    store, infos = two_entries
    wide = entry_of(store, WIDE)
    shutil.rmtree(wide)
    shutil.copytree(entry_of(store, NARROW), wide)  # whole and signed, but the 512-wide kernel
    capsys.readouterr()

    _, info = fresh_get(store, WIDE)
    assert info.cache == "rebuilt" and "holds another kernel: its key differs" in info.note
    assert info.registers == infos[1024].registers and loads == []
    assert len(cache_lines(capsys.readouterr().err)) == 1
    assert json.loads((wide / META).read_text())["key"] == repr(IMPL.compile_key(WIDE, ARCH))
    again = fresh_get(store, WIDE)[1]
    assert again.cache == "disk" and again.registers == infos[1024].registers


@pytest.mark.parametrize("attack", ["crafted object, digests updated", "signed with another user's key"])
def test_an_entry_not_signed_by_this_user_is_never_loaded_and_is_rebuilt(two_entries, loads, user_key, attack):
    store, _ = two_entries
    entry = entry_of(store, NARROW)
    if attack == "crafted object, digests updated":  # all the sha256 beside the object asked for
        crafted = (entry_of(store, WIDE) / OBJECT).read_bytes()
        (entry / OBJECT).write_bytes(crafted)
        meta = json.loads((entry / META).read_text())
        meta["payloads"][OBJECT] = {"bytes": len(crafted), "sha256": sha256(crafted)}
        (entry / META).write_text(json.dumps(meta))
    else:
        user_key.unlink()  # another user (another key) finds this user's entry
    found = (entry / OBJECT).read_bytes()

    _, info = fresh_get(store)
    assert info.cache == "rebuilt" and "not signed with this user's cache key" in info.note
    assert loads == []  # the loader never saw the entry it found
    assert store.counters()["corrupt_rebuilt"] == 1
    _, again = fresh_get(store)
    rebuilt = (entry / OBJECT).read_bytes()
    assert again.cache == "disk" and loads == [rebuilt]  # what is loaded now is this user's rebuild
    if attack == "crafted object, digests updated":
        assert rebuilt != found


def test_the_cache_directory_is_made_owner_only_and_the_key_private(tmp_path, user_key):
    store = DiskStore(tmp_path / "new" / "kernels")
    assert fresh_get(store)[1].cache == "miss"
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(user_key.stat().st_mode) == 0o600 and store.root not in user_key.parents
    assert fresh_get(store)[1].cache == "disk"  # the same key next time


@pytest.mark.parametrize("mode, trusted", [(0o777, False), (0o1777, True)])
def test_a_cache_every_user_may_write_is_refused_unless_sticky_and_ours(tmp_path, loads, capsys, mode, trusted):
    store = DiskStore(tmp_path / "kernels")
    fresh_get(store)
    store.root.chmod(mode)
    capsys.readouterr()
    _, info = fresh_get(store)
    warnings = cache_lines(capsys.readouterr().err)
    if trusted:
        assert info.cache == "disk" and warnings == []
    else:
        assert info.cache == "miss" and loads == [] and "not stored: every user may write" in info.note
        assert len(warnings) == 1 and "every user may write to the cache directory" in warnings[0]


def make_unusable(store: DiskStore, user_key, flavour: str) -> None:
    if flavour == "root is a file":
        store.root.write_text("")
    elif flavour == "an entry's .lock is a directory":
        entry = entry_of(store, NARROW)
        entry.with_name(entry.name + ".lock").mkdir(parents=True)
    elif flavour == "the stats .lock is a directory":
        (store.root / (STATS + ".lock")).mkdir(parents=True)
    elif flavour == "the key is readable by others":
        fresh_get(store, WIDE)
        user_key.chmod(0o644)


@pytest.mark.parametrize("flavour", ["root is a file", "an entry's .lock is a directory",
                                     "the stats .lock is a directory", "the key is readable by others"])
def test_an_unusable_cache_compiles_without_storing_and_warns_once(tmp_path, user_key, capsys, flavour):
    store = DiskStore(tmp_path / "kernels")
    make_unusable(store, user_key, flavour)
    capsys.readouterr()
    cache = CompileCache(store=store, use_disk=True)
    infos = [cache.get(IMPL, case, ARCH)[1] for case in (NARROW, WIDE)]
    assert [i.cache for i in infos] == ["miss", "miss"] and all(i.registers for i in infos)
    assert "not stored:" in infos[1].note
    warnings = cache_lines(capsys.readouterr().err)
    assert len(warnings) == 1 and warnings[0].endswith("compiling without storing kernels"), warnings


def test_a_stats_file_that_is_not_a_table_is_started_again(tmp_path, capsys):
    store = DiskStore(tmp_path / "kernels")
    store.root.mkdir(parents=True)
    (store.root / STATS).write_text("[]")
    assert fresh_get(store)[1].cache == "miss" and fresh_get(store)[1].cache == "disk"
    assert store.counters() == {"compiles": 1, "disk_hits": 1} and cache_lines(capsys.readouterr().err) == []


def set_writable(top, writable: bool) -> None:
    for path in [top, *top.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~0o222)


@pytest.fixture
def read_only(tmp_path, user_key):
    """(directory, run): `run(argv)` runs a command with DSV4BENCH_CACHE_DIR=directory on a read-only file
    system: a private read-only bind mount as root (who ignores permissions), the write bits dropped otherwise."""
    ro = tmp_path / "ro"
    ro.mkdir()
    as_root = os.geteuid() == 0
    env = cli_env(**{ENV_DIR: str(ro), ENV_KEY: str(user_key)})
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        if as_root:
            argv = ["unshare", "-m", "sh", "-c", mount, str(ro), *argv]
        else:
            set_writable(ro, False)
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)

    if as_root and (shutil.which("unshare") is None or run(["true"]).returncode):
        pytest.skip("no private read-only mount here (unshare -m)")
    yield ro, run
    if not as_root:
        set_writable(ro, True)


def test_a_read_only_cache_compiles_without_storing_and_clear_is_one_line_exit_2(read_only):
    ro, run = read_only
    fresh_get(DiskStore(ro / "kernels"))  # an entry to clear
    script = ("from dsv4bench.compile.cache import CompileCache; from dsv4bench.core.case import Case; "
              "from dsv4bench.core.registry import get_impl; cache = CompileCache(); "
              "cases = [Case('rmsnorm', {'m': 8, 'n': n, 'dtype': 'bf16', 'weight': True}) for n in (512, 1024)]; "
              "[print(cache.get(get_impl('rmsnorm', 'cutedsl'), c, 'sm_90a')[1].cache) for c in cases]")
    res = run([sys.executable, "-c", script])
    assert res.returncode == 0 and res.stdout.split() == ["miss", "miss"], res.stderr[-2000:]
    warnings = cache_lines(res.stderr)
    assert len(warnings) == 1 and "compiling without storing kernels" in warnings[0], res.stderr[-2000:]

    res = run([sys.executable, "-m", "dsv4bench", "cache", "clear"])
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and len(out.splitlines()) == 1 and "cannot clear" in out, out


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`dsv4bench ARGS` through the real entry point, in this process."""
    monkeypatch.setattr(sys, "argv", ["dsv4bench", *args])
    with pytest.raises(SystemExit) as done:
        main()
    out = capsys.readouterr()
    return done.value.code, (out.out + out.err).strip()


@pytest.mark.parametrize("command, where", [(c, w) for c in ("ls", "stats", "clear") for w in ("missing", "a file")]
                         + [("warm", "a file")])  # warm makes a missing cache
def test_cache_commands_on_a_missing_or_unusable_directory_are_one_line_exit_2(tmp_path, monkeypatch, capsys,
                                                                             command, where):
    path = tmp_path / "cache"
    if where == "a file":
        path.write_text("")
    code, out = run_cli(monkeypatch, capsys, "cache", command, *(["rmsnorm"] if command == "warm" else []),
                        "--dir", str(path))
    assert code == 2 and len(out.splitlines()) == 1 and str(path) in out and "Traceback" not in out, out
