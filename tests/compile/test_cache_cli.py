"""`dsv4bench layouts` on every CuTeDSL family and on a linted kernel; `dsv4bench cache` commands."""

from __future__ import annotations

import json

import pytest
from planted_kernels import PlantedFamily, PlantedImpl
from typer.testing import CliRunner

from dsv4bench.cli.common import UsageProblem
from dsv4bench.cli.main import app
from dsv4bench.core import registry
from dsv4bench.core.registry import families, impls


def cli(*args: str) -> tuple[int, str]:
    """In-process `dsv4bench ARGS`, bad input mapped to exit 2 as main() does."""
    res = CliRunner().invoke(app, list(args))
    if isinstance(res.exception, UsageProblem):
        return 2, f"error: {res.exception}"
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


CUTEDSL_FAMILIES = sorted(f for f in families() if any(i.compiles for i in impls(f)))


@pytest.mark.parametrize("family", CUTEDSL_FAMILIES)
def test_layouts_works_on_cpu_for_every_cutedsl_family(family, tmp_path):
    code, out = cli("layouts", family, "--json", str(tmp_path / "rec.json"))
    assert code == 0, out
    dump = json.loads((tmp_path / "rec.json").read_text())
    entries = dump["recording"]["entries"]
    assert dump["arch"] == "sm_90a" and any(e["group"] == "launch" for e in entries)
    flat = " ".join(out.split())
    for e in entries:  # every stage the kernel (and the launch hook) recorded is printed
        first_lines = [" ".join((str(v).splitlines() or [""])[0].split())[:60] for v in e["fields"].values()]
        assert e["stage"] in flat and all(line in flat for line in first_lines)
    assert "lints: none" in out and dump["lints"] == []
    assert "ptxas: ok" in flat or "ptxas: skipped: no ptxas" in flat  # the wgmma check always reports


def test_layouts_of_rmsnorm_follow_the_case_options():
    code, out = cli("layouts", "rmsnorm", "--width", "7168", "--arch", "sm_100a")
    assert code == 0 and "n=7168" in out and "sm_100a" in out
    assert "((512,1),(8,2)):((8,1),(1,4096))" in out  # 512 threads x 8 elements x 2 vectors per row of 7168
    assert "block: [512, 1, 1]" in out


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setitem(registry._FAMILIES, "planted", PlantedFamily())
    monkeypatch.setitem(registry._IMPLS, "planted", [PlantedImpl()])


def test_layouts_warns_on_a_failing_lint(planted):
    code, out = cli("layouts", "planted", "--bug", "slice")
    assert code == 0
    assert "lints: 1" in out and "warning: lint tma-tile-mode [K tile after TMA partition]" in " ".join(out.split())
    assert "slice: (_,_,0,0)" in out and "after slice: (((64,64),1),1):" in out
    code, out = cli("layouts", "planted")  # the first case is the correct twin
    assert code == 0 and "lints: none" in out and "PipelineTmaAsync" in out and "tx_count: 16384" in out


@pytest.mark.parametrize("args, message", [
    (["layouts", "nope"], "unknown kernel family 'nope'"),
    (["layouts", "rmsnorm", "--hd", "64"], "does not apply to rmsnorm"),
    (["layouts", "rmsnorm", "--width", "x"], "--width needs a comma-separated list of integers"),
    (["layouts", "rmsnorm", "--arch", "sm_80"], "unsupported arch 'sm_80'"),
    (["layouts", "rmsnorm", "stray"], "unexpected argument 'stray'"),
    (["cache", "warm", "nope"], "unknown kernel family 'nope'"),
    (["cache", "warm", "rmsnorm", "--arch", "sm_80"], "unsupported arch 'sm_80'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    code, out = cli(*args)
    assert code == 2 and message in out and len(out.strip().splitlines()) == 1


def test_cache_warm_ls_stats_clear(planted, tmp_path):
    d = ["--dir", str(tmp_path)]
    code, out = cli("cache", "warm", "planted", "--arch", "sm_90a,sm_100a", *d)
    assert code == 0, out
    assert "8 kernels for sm_90a,sm_100a" in out and "compiled 8, already cached 0" in " ".join(out.split())
    assert out.count("lint") >= 6  # three planted bugs x two archs, reported while warming
    code, out = cli("cache", "warm", "planted", "--arch", "sm_90a", *d)
    assert code == 0 and "compiled 0, already cached 4" in " ".join(out.split())

    code, out = cli("cache", "ls", *d)
    assert code == 0 and "8 entries" in out and out.count("current") == 8 and "bug=tx" in out
    code, out = cli("cache", "stats", *d)
    assert code == 0 and "entries 8 (stale 0, unreadable 0); compiles 8, disk hits 4" in " ".join(out.split())
    code, out = cli("cache", "clear", "rmsnorm", *d)
    assert code == 0 and "removed 0 entries" in out
    code, out = cli("cache", "clear", *d)
    assert code == 0 and "removed 8 entries" in out
    assert "0 entries" in cli("cache", "ls", *d)[1]
