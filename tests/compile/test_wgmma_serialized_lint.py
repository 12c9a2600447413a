"""Lint `wgmma-serialized`: ptxas -v on the kept PTX of an sm_90a compile (dsv4bench/compile/ptxas.py).

A wgmma under a thread-dependent runtime branch (tests/compile/planted_wgmma.py) makes ptxas
serialize every wgmma (C7520): the lint flags it, the worker fails the case with FAIL_LINT, also
when the kernel comes back from the disk cache; the correct twin passes; a uniform branch only gets
the C7519 note. The DSV4 Pro attention config must be clean. Tests that need ptxas skip without one.
"""

from __future__ import annotations

import os
import stat

import pytest
from planted_kernels import PlantedImpl
from planted_wgmma import compile_wgmma

from dsv4bench.compile import ptxas
from dsv4bench.compile.cache import compile_recorded, ptxas_fact
from dsv4bench.compile.lints import lint
from kernels.trace import Recording
from dsv4bench.compile.store import DiskStore
from dsv4bench.core.case import Case
from dsv4bench.core.results import COMPILED, FAIL_LINT, ResultRecord
from dsv4bench.core.worker import Worker

needs_ptxas = pytest.mark.skipif(
    ptxas.find_ptxas() is None,
    reason="no ptxas found ($DSV4BENCH_PTXAS, PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin): "
           "the wgmma-serialized lint runs ptxas -v on the PTX and cannot run here")

C7520 = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
         "program dependence on compiler-inserted WG.AR in divergent path in the function 'kernel_fmha_0'")
C7519 = ("ptxas info    : (C7519) warpgroup.arrive is injected in around line 94 by compiler to allow use of "
         "registers in GMMA in function 'kernel_fmha_0'")
C7514 = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
         "non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline "
         "stage in the function 'kernel_x'")


class WgmmaImpl(PlantedImpl):
    name = "cutedsl-wgmma"

    def compile(self, case, arch):
        return compile_wgmma(case["bug"], arch=arch)


def compile_linted(branch):
    _, rec, _ = compile_recorded(WgmmaImpl(), Case("planted", {"bug": branch}), "sm_90a")
    return rec, lint(rec)


def test_parse_ptxas_messages():
    serialized, injected = ptxas.parse(f"{C7520}\n{C7519}\nptxas info    : Used 58 registers\n{C7514}")
    assert [m["code"] for m in serialized] == ["C7520", "C7514"]
    assert serialized[0]["function"] == "kernel_fmha_0" and serialized[0]["message"].endswith("in divergent path")
    assert injected == [{"code": "C7519", "function": "kernel_fmha_0", "line": 94, "message":
                         "warpgroup.arrive is injected in around line 94 by compiler to allow use of registers in GMMA"}]


def test_serialized_fact_is_a_finding_and_injections_are_notes():
    s, i = ptxas.parse(f"{C7520}\n{C7519}")
    fact = {"rule": "wgmma-serialized", "stage": "ptxas sm_90a", "status": "ok", "serialized": s, "injected": i,
            "seconds": 0.5}
    (finding,) = lint(Recording(facts=[fact]))
    assert finding.rule == "wgmma-serialized" and finding.stage == "ptxas sm_90a"
    assert "ptxas C7520" in finding.message and "runtime branch" in finding.message
    assert lint(Recording(facts=[{**fact, "serialized": []}])) == []
    assert ptxas.summary({**fact, "serialized": []}) == "ok (0.50 s); C7519 warpgroup.arrive injected x1 (PTX lines 94)"


@needs_ptxas
def test_wgmma_under_a_divergent_branch_is_flagged():
    rec, findings = compile_linted("divergent")
    assert [f.rule for f in findings] == ["wgmma-serialized"]
    assert "ptxas C7520" in findings[0].message and "divergent path" in findings[0].message
    assert ptxas_fact(rec)["status"] == "ok"


@needs_ptxas
def test_correct_twin_passes():
    rec, findings = compile_linted(None)
    fact = ptxas_fact(rec)
    assert findings == [] and fact["status"] == "ok" and fact["serialized"] == [] and fact["injected"] == []


@needs_ptxas
def test_uniform_branch_is_a_note_not_a_failure(capsys):
    rec, findings = compile_linted("uniform")
    assert findings == []
    assert [m["code"] for m in ptxas_fact(rec)["injected"]] == ["C7519"]
    assert "note: ptxas C7519: warpgroup.arrive is injected" in capsys.readouterr().err


def compile_record(worker, branch):
    case = Case("planted", {"bug": branch})
    rec = ResultRecord(run_id="t", task="t", case_id=case.id, family="planted", impl="cutedsl-wgmma",
                       backend="cutedsl", arch="sm_90a", mode="compile", device="cpu", params=dict(case.params),
                       seed=0, origin="cli", status="")
    worker.compile(rec, WgmmaImpl(), case, "sm_90a")
    return rec


@needs_ptxas
def test_worker_fails_a_serialized_kernel_also_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path))
    good = compile_record(Worker(), None)
    assert good.status == COMPILED and good.compile["ptxas"].startswith("ok (")
    bad = compile_record(Worker(), "divergent")
    assert bad.status == FAIL_LINT and bad.reason.startswith("wgmma-serialized [ptxas sm_90a]: ptxas C7520")
    assert bad.compile["cache"] == "miss" and "C7520 wgmma serialized (lint)" in bad.compile["ptxas"]
    again = compile_record(Worker(), "divergent")  # a fresh process: loaded, no ptxas run, same verdict
    assert again.compile["cache"] == "disk" and again.status == FAIL_LINT and again.reason == bad.reason
    assert again.compile["ptxas"] == bad.compile["ptxas"]
    uniform = compile_record(Worker(), "uniform")
    assert uniform.status == COMPILED and "C7519 warpgroup.arrive injected x1" in uniform.compile["ptxas"]
    assert len(list(DiskStore(tmp_path / "kernels").entries())) == 3


def test_no_ptxas_skips_once_and_never_fails(monkeypatch, capsys):
    monkeypatch.setenv(ptxas.ENV, "/nonexistent/ptxas")
    monkeypatch.setattr(ptxas, "_warned", False)
    assert ptxas.find_ptxas() is None and not ptxas.keep_ptx("sm_90a")
    for branch in ("divergent", None):
        rec, findings = compile_linted(branch)
        assert findings == [] and ptxas_fact(rec)["status"] == "skipped: no ptxas"
        assert ptxas.summary(ptxas_fact(rec)) == "skipped: no ptxas"
    err = capsys.readouterr().err
    assert err.count("lint wgmma-serialized skipped: no ptxas") == 1


def test_off_and_no_warpgroup_mma_arch(monkeypatch, capsys):
    monkeypatch.setenv(ptxas.ENV, "off")
    monkeypatch.setattr(ptxas, "_warned", False)
    assert ptxas.check(object(), "sm_90a")["status"] == "skipped: no ptxas"
    assert ptxas.check(object(), "sm_80") is None
    assert capsys.readouterr().err == ""  # turned off on purpose: nothing to say


def test_find_ptxas_falls_back_to_cuda_home(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "ptxas"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.delenv(ptxas.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert ptxas.find_ptxas() == os.fspath(exe)
    monkeypatch.setenv(ptxas.ENV, os.fspath(exe))
    assert ptxas.find_ptxas() == os.fspath(exe)


@needs_ptxas
def test_fmha_dsv4_pro_config_is_not_serialized():
    from kernels.fmha.config import Config
    from kernels.fmha.compiling import compile_config

    fact = ptxas.check(compile_config(Config(d=512, dv=512, hpg=128, kv_shared=True, per_token_idx=True), "sm_90a"),
                       "sm_90a")
    assert fact["status"] == "ok", fact["status"]
    assert fact["serialized"] == [], fact["serialized"]
    assert lint(Recording(facts=[fact])) == []


def test_a_ptxas_older_than_the_ptx_skips_once_and_never_fails(tmp_path, monkeypatch, capsys):
    """The H100 host's CUDA 13.0 ptxas cannot read CuTeDSL's PTX 9.4: a skip, not an error."""
    exe = tmp_path / "ptxas"
    exe.write_text("#!/bin/sh\necho \"ptxas $3, line 9; fatal : Unsupported .version 9.4; current version is '9.0'\" >&2\n"
                   "exit 255\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ptxas.ENV, os.fspath(exe))
    monkeypatch.setattr(ptxas, "_warned", False)
    for branch in ("divergent", None):
        rec, findings = compile_linted(branch)
        status = ptxas_fact(rec)["status"]
        assert findings == [] and status.startswith("skipped: ptxas older than the PTX"), status
        assert "Unsupported .version 9.4; current version is '9.0'" in status
    assert capsys.readouterr().err.count("skipped: ptxas older than the PTX") == 1


class _Several:
    """A compile of several kernels, as moe's layer and fmha's decode hand the harness."""

    def __init__(self, **kernels):
        self.kernels = kernels


@needs_ptxas
def test_a_compile_of_several_kernels_is_checked_kernel_by_kernel():
    clean, divergent = compile_wgmma(None, arch="sm_90a"), compile_wgmma("divergent", arch="sm_90a")
    assert ptxas.check(_Several(a=clean, b=clean), "sm_90a")["serialized"] == []
    fact = ptxas.check(_Several(a=clean, b=divergent), "sm_90a")
    assert fact["status"] == "ok" and [m["code"] for m in fact["serialized"]] == ["C7520"]
    assert ptxas.check(_Several(a=clean, b=object()), "sm_90a")["status"].startswith("skipped: PTX not kept")
