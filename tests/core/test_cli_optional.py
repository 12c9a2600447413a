"""A command group whose optional dependency is missing degrades to one clear line; the rest works."""

from __future__ import annotations

import subprocess
import sys

from tests.core.helpers import ROOT, cli_env

WITHOUT_ASYNCSSH = "import sys; sys.modules['asyncssh'] = None; sys.argv = ['dsv4bench'] + sys.argv[1:]; " \
                   "from dsv4bench.cli.main import main; main()"


def run_without_asyncssh(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_ASYNCSSH, *args], capture_output=True, text=True,
                          env=cli_env(), cwd=ROOT, timeout=120)


def test_other_commands_work_without_asyncssh():
    res = run_without_asyncssh("list")
    assert res.returncode == 0 and "rmsnorm" in res.stdout, res.stdout + res.stderr


def test_remote_without_asyncssh_is_one_line_exit_2():
    res = run_without_asyncssh("remote", "hosts")
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and "'dsv4bench remote' is unavailable here" in out and "asyncssh" in out, out
    assert len(out.splitlines()) == 1
