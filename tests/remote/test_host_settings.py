"""Bad host settings and job files are one line naming the file and key, exit status 2, found
before anything connects or launches (issue #27)."""

from __future__ import annotations

import json

import pytest

from tests.remote.helpers import cli, small_repo

GOOD = "[hosts.a]\nssh = 'x'\nworkdir = '/w'\n"


@pytest.mark.parametrize("extra, message", [
    ("ssh_config = 5\n", "ssh_config must be a path (a non-empty string), not 5"),
    ("keep_jobs = 'abc'\n", "keep_jobs must be an integer >= 0, not 'abc'"),
    ("gpu = true\n", "gpu must be a GPU index (an integer >= 0), not True"),
    ("timeout_s = true\n", "timeout_s must be a positive number, not True"),
    ("gpu_lock = 'no'\n", "gpu_lock must be true or false, not 'no'"),
    ("python = ''\n", "python must be a non-empty string, not ''"),
    ("env = { A = [1] }\n", "env must map variable names to strings or numbers, not {'A': [1]}"),
])
def test_mistyped_setting_is_one_line_naming_file_and_key(tmp_path, extra, message):
    path = tmp_path / "hosts.toml"
    path.write_text(GOOD + extra)
    res = cli("remote", "hosts", "--hosts", str(path))
    assert res.code == 2, res.output
    assert res.output.strip() == f"error: {path}, host 'a': {message}"


def test_hosts_file_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "hosts.toml"
    path.write_bytes(GOOD.encode() + b"setup = '\xff\xfe'\n")
    res = cli("remote", "hosts", "--hosts", str(path))
    assert res.code == 2, res.output
    assert res.output.startswith(f"error: cannot read hosts file {path}: 'utf-8' codec can't decode")
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("setting", [{"keep_jobs": "abc"}, {"gpu": True}])
def test_mistyped_setting_fails_before_anything_launches(make_host, tmp_path, setting):
    hosts = make_host(**setting)
    res = cli("remote", "submit", "loop", "--tree", str(small_repo(tmp_path / "repo", {"a": ""})), "--", "exit", "0")
    assert res.code == 2, res.output
    key = next(iter(setting))
    assert res.output.startswith(f"error: {hosts}, host 'loop': {key} must be")
    assert not (tmp_path / "remote").exists() and not (tmp_path / "state").exists()


def _record(tmp_path, text: str):
    state = tmp_path / "state"
    state.mkdir()
    path = state / "20250101-000000000-abcdef.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", [["remote", "status"], ["remote", "status", "abcdef"],
                                     ["remote", "cancel", "abcdef"], ["remote", "logs", "abcdef"]])
def test_corrupt_job_file_is_one_line_naming_it(tmp_path, monkeypatch, command):
    monkeypatch.setenv("DSV4BENCH_STATE_DIR", str(tmp_path / "state"))
    path = _record(tmp_path, '{"id": "20250101-000000000-abcdef", "host": {')
    res = cli(*command)
    assert res.code == 2, res.output
    assert res.output.startswith(f"error: corrupt job file {path}: ") and len(res.output.strip().splitlines()) == 1


def test_job_file_with_a_mistyped_host_setting_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_STATE_DIR", str(tmp_path / "state"))
    host = {"name": "a", "ssh": "x", "workdir": "/w", "keep_jobs": "abc", "gpu": None}
    path = _record(tmp_path, json.dumps({"id": "20250101-000000000-abcdef", "host": host, "remote_dir": "/w/j",
                                         "argv": ["x"], "tree_id": "t"}))
    res = cli("remote", "status", "abcdef")
    assert res.code == 2, res.output
    assert res.output.strip() == f"error: corrupt job file {path}: keep_jobs must be an integer >= 0, not 'abc'"
