"""The disk store never trusts an entry: truncated, altered or unreadable entries are detected,
reported once, rebuilt; keys follow the kernel's sources; kernels loaded from disk pass on a GPU."""

from __future__ import annotations

import pytest

from dsv4bench.compile import fingerprint as fp
from dsv4bench.compile.artifacts import CUBIN, OBJECT, PTX, LoadedKernel
from dsv4bench.compile.cache import CompileCache
from dsv4bench.compile.ptxas import keep_ptx
from dsv4bench.compile.store import META, DiskStore
from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, get_impl

IMPL = get_impl("rmsnorm", "cutedsl")
CASE = Case("rmsnorm", {"m": 64, "n": 512, "dtype": "bf16", "weight": True})


@pytest.fixture
def store(tmp_path):
    s = DiskStore(tmp_path)
    _, info = CompileCache(store=s, use_disk=True).get(IMPL, CASE, "sm_90a")
    assert info.cache == "miss"
    return s


def the_entry(store):
    (entry, meta), = list(store.entries())
    return entry, meta


def fresh_get(store):
    """What a new process sees: no memory cache, the same disk."""
    return CompileCache(store=store, use_disk=True).get(IMPL, CASE, "sm_90a")


def test_entry_holds_object_cubin_and_metadata_and_loads_without_jit(store):
    entry, meta = the_entry(store)
    kept = {PTX} if keep_ptx("sm_90a") else set()  # the PTX is kept for the wgmma-serialized lint when a ptxas exists
    assert {p.name for p in entry.iterdir()} == {OBJECT, CUBIN, META} | kept
    assert meta["family"] == "rmsnorm" and meta["arch"] == "sm_90a" and meta["versions"]["cutlass-dsl"]
    assert meta["payloads"][OBJECT]["bytes"] == (entry / OBJECT).stat().st_size > 1000
    assert meta["compile"]["registers"] > 0 and meta["compile"]["compile_seconds"] > 0
    stages = [e["stage"] for e in meta["recording"]["entries"]]
    assert stages[0] == "RmsNormKernel.kernel" and stages[1].startswith("TV layout")  # the launch, then the kernel
    cache = CompileCache(store=store, use_disk=True)
    kernel, info = cache.get(IMPL, CASE, "sm_90a")
    assert isinstance(kernel, LoadedKernel) and info.cache == "disk" and cache.compiles == 0
    assert info.registers == meta["compile"]["registers"] and kernel.__cubin__ == (entry / CUBIN).read_bytes()
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


@pytest.mark.parametrize("damage", ["truncate object", "flip a byte", "drop cubin", "garbage metadata"])
def test_corrupt_entry_is_detected_rebuilt_and_reported_once(store, capsys, damage):
    entry, _ = the_entry(store)
    obj = entry / OBJECT
    if damage == "truncate object":
        obj.write_bytes(obj.read_bytes()[: obj.stat().st_size // 2])
    elif damage == "flip a byte":
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    elif damage == "drop cubin":
        (entry / CUBIN).unlink()
    else:
        (entry / META).write_text("{not json")
    capsys.readouterr()

    _, info = fresh_get(store)
    assert info.cache == "rebuilt" and info.note.startswith("corrupt cache entry rebuilt")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "corrupt cache entry" in line]
    assert len(warnings) == 1 and str(entry) in warnings[0]
    assert store.counters()["corrupt_rebuilt"] == 1

    _, again = fresh_get(store)  # the rebuilt entry is whole: loaded, nothing reported
    assert again.cache == "disk" and "corrupt" not in capsys.readouterr().err
    assert store.counters() == {"compiles": 2, "corrupt_rebuilt": 1, "disk_hits": 1}


def test_key_covers_arch_parameters_and_kernel_sources(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)
    cache = CompileCache(store=store, use_disk=True)
    cache.get(IMPL, CASE, "sm_90a")
    cache.get(IMPL, CASE, "sm_100a")
    cache.get(IMPL, Case("rmsnorm", {"m": 7, "n": 512, "dtype": "bf16", "weight": True}), "sm_90a")  # rows: runtime
    cache.get(IMPL, Case("rmsnorm", {"m": 64, "n": 512, "dtype": "bf16", "weight": False}), "sm_90a")
    assert cache.compiles == 3 and len(list(store.entries())) == 3
    files = fp.source_files("kernels.rmsnorm.family")
    assert {"kernels.rmsnorm.rmsnorm", "kernels.common", "kernels.rmsnorm.family"} <= set(files)
    assert not any(m.startswith(("oracles", "sweeps", "dsv4bench")) for m in files)
    monkeypatch.setattr(fp, "versions", lambda: {"cutlass-dsl": "9.9", "python": "3.11"})
    fp.fingerprint.cache_clear()
    try:
        _, info = CompileCache(store=store, use_disk=True).get(IMPL, CASE, "sm_90a")
        assert info.cache == "miss"  # another library version: another entry
    finally:
        fp.fingerprint.cache_clear()


def test_source_walk_follows_relative_and_absolute_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "kfake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "family.py").write_text("import os\nfrom kfake.sub import kern\nfrom . import helpers\n")
    (pkg / "sub" / "kern.py").write_text("from ..common import X\n")
    (pkg / "common.py").write_text("X = 1\n")
    (pkg / "helpers.py").write_text("")
    (pkg / "unused.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fp, "ROOT_PACKAGE", "kfake")
    fp.fingerprint.cache_clear()
    try:
        assert sorted(fp.source_files("kfake.family")) == [
            "kfake", "kfake.common", "kfake.family", "kfake.helpers", "kfake.sub", "kfake.sub.kern"]
        before = fp.fingerprint("kfake.family")
        (pkg / "common.py").write_text("X = 2\n")
        fp.fingerprint.cache_clear()
        assert fp.fingerprint("kfake.family") != before
    finally:
        fp.fingerprint.cache_clear()


def test_no_cache_env_turns_the_disk_off(monkeypatch, tmp_path):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path))
    assert CompileCache().store.root == tmp_path / "kernels"
    monkeypatch.setenv("DSV4BENCH_NO_KERNEL_CACHE", "1")
    assert CompileCache().store is None


# bundles of several compiles (a `kernels` dict beside other fields): (family, op)
BUNDLES = (("indexer", "topk"), ("indexer", "select"), ("moe", "layer"))


def first_case(family_name: str, op: str | None = None) -> Case:
    from dsv4bench.core.registry import SweepOptions, get_family

    cases = get_family(family_name).cases(SweepOptions(examples=0))
    return next(c for c in cases if op is None or c.params.get("op") == op)


def gpu_cases() -> list[tuple[str, Case]]:
    """RMSNorm's weighted, weightless and ragged widths, the first production case of every other
    CuTeDSL family (mhc's pair of kernels and fmha included), and the bundles' first cases."""
    from dsv4bench.core.registry import families, impls

    out = [("rmsnorm", Case("rmsnorm", {"m": 1001, "n": n, "dtype": "bf16", "weight": w}))
           for n, w in ((7168, True), (512, False), (1000, True))]
    for fam in sorted(families()):
        if fam != "rmsnorm" and any(i.name == "cutedsl" and i.compiles for i in impls(fam)):
            out.append((fam, first_case(fam)))
    return out + [(fam, first_case(fam, op)) for fam, op in BUNDLES if fam in families()]


def test_a_bundle_is_stored_and_comes_back_with_its_fields_and_loaded_functions(tmp_path):
    """The indexer's top-k (five compiles behind one dispatcher) and its fused select (six compiles and
    the nested top-k bundle): the second process loads every function from disk, no JIT, and the
    bundle's other fields as they were."""
    from dsv4bench.compile.artifacts import BUNDLE, artifact, compiled_functions

    store = DiskStore(tmp_path)
    for op in ("topk", "select"):
        impl, case = get_impl("indexer", "cutedsl"), first_case("indexer", op)
        first, info = CompileCache(store=store, use_disk=True).get(impl, case, "sm_90a")
        assert info.cache == "miss" and "not stored" not in info.note, info.note
        cache = CompileCache(store=store, use_disk=True)
        again, info2 = cache.get(impl, case, "sm_90a")
        assert info2.cache == "disk" and cache.compiles == 0 and type(again) is type(first)
        assert list(again.kernels) == list(first.kernels)
        assert all(isinstance(f, LoadedKernel) for f in compiled_functions(again))
        assert [f.__cubin__ for f in compiled_functions(again)] == [artifact(f) for f in compiled_functions(first)]
        assert (info2.registers, info2.local_bytes) == (info.registers, info.local_bytes)
        if op == "select":  # the nested bundle is the same object the outer one's kernels name
            assert again.kernels["topk-direct"] is again.topk.kernels["direct"]
    assert all((e / BUNDLE).is_file() for e, _ in store.entries())


@pytest.mark.gpu
@pytest.mark.parametrize("family_name, case", gpu_cases(), ids=lambda v: v if isinstance(v, str) else v.id)
def test_kernels_loaded_from_the_cache_pass_on_the_gpu(tmp_path, family_name, case):
    import torch

    from dsv4bench.core.compare import compare_outputs
    from dsv4bench.core.registry import get_family
    from dsv4bench.core.evaluate import CaseData, poison

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    impl, family = get_impl(family_name, "cutedsl"), get_family(family_name)
    reason = impl.supports(case, arch)
    if reason:
        pytest.skip(reason)
    store = DiskStore(tmp_path)
    assert CompileCache(store=store, use_disk=True).get(impl, case, arch)[1].cache == "miss"
    kernel, info = CompileCache(store=store, use_disk=True).get(impl, case, arch)
    assert info.cache == "disk", info.note  # loaded from the exported object, no JIT
    data = CaseData(family, case, "cuda")
    out = family.alloc_outputs(case, "cuda")
    poison(out)
    result = impl.run(case, data.inputs, out, kernel)
    torch.cuda.synchronize()
    ok, metrics = compare_outputs(result, data.oracle, data.lowprec, lambda name: family.tolerance_for(case, name))
    assert ok, {k: m.summary() for k, m in metrics.items()}


def test_parallel_processes_compile_a_kernel_once(tmp_path):
    import os
    import subprocess
    import sys

    script = ("from dsv4bench.compile.cache import CompileCache; from dsv4bench.core.case import Case; "
              "from dsv4bench.core.registry import get_impl; "
              "c = Case('rmsnorm', {'m': 8, 'n': 1536, 'dtype': 'bf16', 'weight': True}); "
              "print(CompileCache().get(get_impl('rmsnorm', 'cutedsl'), c, 'sm_90a')[1].cache)")
    env = {**os.environ, "DSV4BENCH_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    seen = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert seen == ["disk", "miss"]  # the lock makes the other wait, then load
    store = DiskStore(tmp_path / "kernels")
    assert len(list(store.entries())) == 1 and store.counters() == {"compiles": 1, "disk_hits": 1}


class NotAKernelImpl(Impl):
    """An impl whose compile returns something that is not a compiled function."""

    family, name, backend, compiles = "notakernel", "cutedsl", "cutedsl", True

    def compile_key(self, case, arch):
        return (self.family, self.name, arch)

    def compile(self, case, arch):
        return object()

    def run(self, case, inputs, out, compiled):
        raise AssertionError("never run")


def test_an_object_with_no_kernel_stays_in_memory_only(tmp_path):
    store, case = DiskStore(tmp_path), Case("notakernel", {})
    for _ in range(2):
        _, info = CompileCache(store=store, use_disk=True).get(NotAKernelImpl(), case, "sm_90a")
        assert info.cache == "miss" and info.note.startswith("not stored: TypeError")
    assert list(store.entries()) == []


class HalfBundleImpl(NotAKernelImpl):
    """A bundle one of whose members is not a compiled function."""

    family = "halfbundle"

    def compile(self, case, arch):
        return type("Bundle", (), {"kernels": {"a": object()}})()


def test_a_bundle_with_a_member_that_is_not_a_kernel_stays_in_memory_only(tmp_path):
    store = DiskStore(tmp_path)
    _, info = CompileCache(store=store, use_disk=True).get(HalfBundleImpl(), Case("halfbundle", {}), "sm_90a")
    assert info.cache == "miss" and info.note.startswith("not stored: TypeError")
    assert list(store.entries()) == []
