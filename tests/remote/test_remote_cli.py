"""`remote hosts` checks each host; host keys are verified; bad input is one line with exit status 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dsv4bench.remote.config import ConfigError, load_hosts
from dsv4bench.remote.registry import redact
from tests.remote.conftest import write_ssh_config
from tests.remote.helpers import cli


def test_hosts_lists_and_checks_each_host(sshd, make_host, stub_python, tmp_path):
    make_host(setup=f"export PATH={stub_python}:$PATH")
    # Same sshd, but a known_hosts that pins another key: the connection must be refused.
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(impostor / "host_key")], check=True)
    write_ssh_config(impostor / "ssh_config", impostor, sshd.port)
    (impostor / "ssh_config").write_text((impostor / "ssh_config").read_text().replace(
        str(impostor / "client_key"), str(sshd.root / "client_key")))
    make_host("spoofed", ssh_config=str(impostor / "ssh_config"))
    res = cli("remote", "hosts")
    assert res.code == 5, res.output
    loop = next(line for line in res.output.splitlines() if "│ loop" in line)
    for fact in ("yes", "NVIDIA B200", "570.86.15", "12.8"):
        assert fact in loop, res.output
    assert "│ no " in next(line for line in res.output.splitlines() if "│ spoofed" in line)
    assert "unreachable: cannot reach host 'spoofed' (ssh loopback): Host key is not trusted" in res.output


@pytest.mark.parametrize("args, message", [
    (["remote", "submit", "nosuch", "--", "sweep", "rmsnorm"], "unknown host 'nosuch' (known: loop)"),
    (["remote", "submit", "loop"], "nothing to run"),
    (["remote", "submit", "loop", "--shards", "2", "--", "sweep", "rmsnorm"], "--shards N needs a slurm host"),
    (["remote", "status", "nosuchjob"], "no job 'nosuchjob'"),
    (["remote", "logs", "nosuchjob"], "no job 'nosuchjob'"),
    (["remote", "submit", "loop", "--tree", "/", "--", "sweep", "rmsnorm"], "is not a git checkout"),
])
def test_bad_input_is_one_line_exit_2(make_host, args, message):
    make_host()
    res = cli(*args)
    assert res.code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output


@pytest.mark.parametrize("text, message", [
    ("", "defines no hosts (a table hosts.NAME per host)"),
    ("[hosts.a]\nssh = 'x'\n", "'workdir' (a string) is required"),
    ("[hosts.a]\nssh = 'x'\nworkdir = '/w'\nbackend = 'k8s'\n", "backend must be one of ssh, slurm"),
    ("[hosts.a]\nssh = 'x'\nworkdir = '/w'\nenv = { 'A B' = '1' }\n", "env must map variable names"),
    ("[hosts.a]\nssh = 'x'\nworkdir = '/w'\ntimeout = 5\n", "unknown key(s) timeout"),
    ("[hosts.a\n", "cannot read hosts file"),
])
def test_bad_hosts_file(tmp_path, text, message):
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_hosts(path)


def test_bad_hosts_file_is_one_whole_line_from_the_real_cli(tmp_path):
    path = tmp_path / "hosts.toml"
    path.write_text("[hosts.a]\nssh = 'x'\nworkdir = '/w'\ntimeout = 5\n")
    res = subprocess.run([sys.executable, "-m", "dsv4bench", "remote", "hosts", "--hosts", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert (res.stdout + res.stderr).strip() == f"error: {path}, host 'a': unknown key(s) timeout"


def test_missing_hosts_file_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_HOSTS", str(tmp_path / "none.toml"))
    res = cli("remote", "hosts")
    assert res.code == 2 and "no hosts file at" in res.output


def test_secret_env_values_are_redacted():
    assert redact({"HF_TOKEN": "abc", "AWS_SECRET_ACCESS_KEY": "k", "CUTE_DSL_ARCH": "sm_100a"}) == {
        "HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***", "CUTE_DSL_ARCH": "sm_100a"}


def test_job_ids_sort_by_submission_time_within_a_second():
    from dsv4bench.remote.registry import new_job_id

    ids = []
    for _ in range(5):
        ids.append(new_job_id())
        time.sleep(0.002)
    assert ids == sorted(ids) and len(set(ids)) == 5
