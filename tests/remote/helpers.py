"""Drive the remote API and CLI from tests: in-process (one torch import for the session)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from dsv4bench.cli.common import UsageProblem
from dsv4bench.cli.main import app
from dsv4bench.remote import jobs, outcome
from dsv4bench.remote.config import get_host
from dsv4bench.remote.packing import pack_tree
from dsv4bench.remote.registry import JobRecord
from dsv4bench.remote.ssh import Remote

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliResult:
    code: int
    output: str


def cli(*args: str) -> CliResult:
    """`dsv4bench ARGS` in-process, with main()'s handling of bad input (one line, exit 2)."""
    res = CliRunner().invoke(app, list(args))
    if isinstance(res.exception, UsageProblem):
        return CliResult(2, f"error: {res.exception}")
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return CliResult(res.exit_code, res.output)


def small_repo(path: Path, files: dict[str, str]) -> Path:
    """A throwaway git checkout to pack."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return path


def submit(host: str, argv: list[str], tree: Path, tasks: int = 1) -> tuple[JobRecord, bool]:
    return asyncio.run(jobs.submit(get_host(host), pack_tree(tree), argv, tasks))


def status(record: JobRecord) -> jobs.JobStatus:
    async def go():
        async with Remote(record.host) as remote:
            return await jobs.status(remote, record)
    return asyncio.run(go())


def wait_for(record: JobRecord, want=outcome.finished, timeout_s: float = 60) -> jobs.JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        st = status(record)
        if want(st.outcome) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def eventually(predicate, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def read_remote(record: JobRecord, *parts: str) -> str:
    return Path(record.remote_dir, *parts).read_text()  # the loopback host shares this filesystem
