"""Issue #26 (5, 6): repro from a run directory without run.json, `--json` output, `--version`
and `-h`, shard file modes, and run-model's escaping of control characters."""

from __future__ import annotations

import json
import os
import stat
import unicodedata

import pytest
from typer.testing import CliRunner

from dsv4bench import __version__
from dsv4bench.cli.common import UsageProblem
from dsv4bench.cli.main import app
from dsv4bench.cli.model import printable
from dsv4bench.core.case import Case
from dsv4bench.core.results import ResultRecord, RunDir, task_key

CASE = Case("rmsnorm", {"dtype": "bf16", "m": 3, "n": 136, "weight": True}, seed=11)


def cli(*args: str):
    """In-process `dsv4bench ARGS`; bad input raises UsageProblem (main() maps it to exit 2)."""
    res = CliRunner().invoke(app, list(args))
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res


def make_run(path, keep: str) -> None:
    """A run directory holding one record of CASE (and one of another case) in `keep` only:
    results.jsonl or results.csv, no run.json."""
    run = RunDir(path).create()
    other = Case("rmsnorm", {"dtype": "bf16", "m": 5, "n": 64, "weight": False}, seed=1)
    for case in (other, CASE):
        run.append(ResultRecord(run.run_id, task_key(case.id, "torch", "cpu", "check"), case.id, case.family,
                                "torch", "torch", "cpu", "check", "cpu", dict(case.params), case.seed,
                                case.origin, "PASS"))
    run.write_csv()
    (run.csv if keep == "results.jsonl" else run.results).unlink()
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == ["logs", keep]


@pytest.mark.parametrize("keep", ["results.jsonl", "results.csv"])
def test_repro_rebuilds_the_case_from_records_alone(keep, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_REGRESSIONS_DIR", str(tmp_path / "no-regressions"))
    make_run(tmp_path / "runs" / "r1", keep)
    res = cli("repro", CASE.id, "--runs", str(tmp_path / "runs"), "--impl", "torch")
    out = " ".join(res.stdout.split())
    assert res.exit_code == 0, res.stdout
    assert str(CASE) in out  # same id: every parameter and the seed came back from the records
    assert f"found in: {tmp_path / 'runs' / 'r1'}" in out
    assert "no run.json, so the run's metadata (command, environment) is absent" in out and keep in out
    assert "torch: PASS" in out  # the case really ran again


def test_repro_names_an_unreadable_csv_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_REGRESSIONS_DIR", str(tmp_path / "no-regressions"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.csv").write_text('case_id,params\n"x,\n')
    with pytest.raises(UsageProblem, match="not found.*skipped 1 unreadable"):
        cli("repro", CASE.id, "--runs", str(tmp_path))


def test_list_and_env_json():
    res = cli("list", "--json")
    listing = json.loads(res.stdout)  # nothing but the document on stdout
    assert res.exit_code == 0 and set(listing) == {"gpu_arch", "families", "broken_modules"}
    rmsnorm = next(f for f in listing["families"] if f["name"] == "rmsnorm")
    torch_impl = next(i for i in rmsnorm["impls"] if i["name"] == "torch")
    assert torch_impl["here"] == "run" and torch_impl["available"] and not torch_impl["variant"]
    assert {"backend", "archs", "checked", "unsupported_archs"} <= set(torch_impl)

    env = json.loads(cli("env", "--json").stdout)
    assert {"python", "host", "commit", "packages", "gpu"} <= set(env) and "torch" in env["packages"]


def test_cache_ls_and_stats_json(tmp_path):
    entry = tmp_path / "rmsnorm" / "cutedsl" / "abc123"
    entry.mkdir(parents=True)
    (entry / "kernel.o").write_bytes(b"\0" * 1000)
    (entry / "meta.json").write_text(json.dumps({
        "family": "rmsnorm", "impl": "cutedsl", "arch": "sm_90a", "fingerprint": "old", "created": 0.0,
        "case": {"params": {"m": 64, "n": 128}}, "compile": {"compile_seconds": 1.5, "registers": 32,
                                                              "lints": ["x"]}}))
    (tmp_path / "rmsnorm" / "cutedsl" / "torn").mkdir()
    (tmp_path / "rmsnorm" / "cutedsl" / "torn" / "meta.json").write_text("{")
    (tmp_path / "stats.json").write_text(json.dumps({"compiles": 3, "disk_hits": 2}))

    ls = json.loads(cli("cache", "ls", "--dir", str(tmp_path), "--json").stdout)
    assert ls["root"] == str(tmp_path)
    good, torn = sorted(ls["entries"], key=lambda e: e["state"] == "unreadable")
    assert good["params"] == {"m": 64, "n": 128} and good["state"] == "stale" and good["lints"] == 1
    assert good["bytes"] > 1000 and good["compile_seconds"] == 1.5 and good["registers"] == 32
    assert torn["state"] == "unreadable" and torn["path"].endswith("torn")

    stats = json.loads(cli("cache", "stats", "--dir", str(tmp_path), "--json").stdout)
    assert stats["entries"] == 1 and stats["stale"] == 1 and stats["unreadable"] == 1
    assert stats["counters"] == {"compiles": 3, "disk_hits": 2, "corrupt_rebuilt": 0}
    assert stats["groups"] == [{"family": "rmsnorm", "impl": "cutedsl", "arch": "sm_90a", "entries": 1,
                                "bytes": good["bytes"], "compile_seconds": 1.5}]


def test_version_and_short_help():
    res = cli("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"dsv4bench {__version__}"
    for args in (["-h"], ["repro", "-h"], ["cache", "-h"], ["cache", "ls", "-h"]):
        res = cli(*args)
        assert res.exit_code == 0 and "Usage:" in res.stdout and "--help" in res.stdout, args
    assert "--json" in cli("cache", "stats", "-h").stdout


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_checkpoint_shards_get_normal_modes(mask, tmp_path):
    from dsv4bench.model.config import TINY
    from dsv4bench.model.synth import write_checkpoint

    old = os.umask(mask)
    try:
        write_checkpoint(TINY, tmp_path / "ckpt")
    finally:
        os.umask(old)
    shards = list((tmp_path / "ckpt").glob("*.safetensors"))
    assert shards and {stat.S_IMODE(p.stat().st_mode) for p in shards} == {0o666 & ~mask}


def test_control_characters_are_escaped():
    assert printable("a\x1b[31mb\rc\x07\x00\x7f") == "a\\x1b[31mb\\rc\\x07\\x00\\x7f"
    assert printable("bidi \u202e and zero-width \u200b") == "bidi \\u202e and zero-width \\u200b"
    assert printable("line\n\ttab é ✓ \ufffd") == "line\n\ttab é ✓ \ufffd"  # kept as they are


def test_run_model_prints_no_raw_control_characters(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path / "cache"))
    res = cli("run-model", "--prompt", "hi\x1b[2J\x07", "--max-new-tokens", "24", "--temperature", "1.5")
    assert res.exit_code == 0, res.stdout
    raw = {c for c in res.stdout if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf")}
    assert not raw and "hi\\x1b[2J\\x07" in res.stdout


def test_missing_hosts_file_says_where_the_format_is(tmp_path):
    from dsv4bench.remote.config import ConfigError, load_hosts

    with pytest.raises(ConfigError) as err:
        load_hosts(tmp_path / "none.toml")
    assert "docs/remote.md, section Hosts" in str(err.value) and "[hosts.NAME]" in str(err.value)
    assert "--help" not in str(err.value)
