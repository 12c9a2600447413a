"""The ssh backend against a real sshd on 127.0.0.1: the job lifecycle, cancel, timeout, the
exit-status taxonomy, the GPU lock, hostile names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dsv4bench.remote import outcome
from dsv4bench.remote.registry import load
from tests.remote.conftest import group_members, write_ssh_config
from tests.remote.helpers import ROOT, cli, eventually, read_remote, small_repo, status, submit, wait_for


def _job_id(output: str) -> str:
    return output.strip().splitlines()[-1] if "submitted" in output else pytest.fail(output)


def test_compile_only_sweep_submit_follow_fetch_report(make_host, tmp_path):
    """Done-when 1: submit a compile-only sweep, follow its logs, fetch and render its report."""
    make_host(env={"CUTE_DSL_ARCH": "sm_100a"})
    sweep = ["sweep", "rmsnorm", "--compile-only", "--arch", "sm_100a", "--examples", "0", "--width", "512",
             "--rows", "64", "--dtype", "bf16", "--out", "run"]
    res = cli("remote", "submit", "loop", "--tree", str(ROOT), "--follow", "--", *sweep)
    assert res.code == 0, res.output
    assert "COMPILED" in res.output and "job " in res.output and "PASS" in res.output
    job = res.output.split("submitted ")[1].split()[0]
    dest = tmp_path / "fetched"
    res = cli("remote", "fetch", job, "--dest", str(dest))
    assert res.code == 0, res.output
    run = dest / "out" / "run"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert records and {r["status"] for r in records} <= {"COMPILED", "PASS", "UNSUPPORTED"}
    meta = json.loads((run / "run.json").read_text())
    assert (run / "results.csv").exists() and meta["kernel"] == "rmsnorm"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert meta["environment"]["commit"].startswith(head.strip()[:12])  # the shipped tree has no .git
    assert "<html" in (run / "index.html").read_text().lower()
    assert "COMPILED" in (dest / "output.log").read_text()
    assert not (dest / "job.env").exists()  # env values may be secrets: they stay on the host
    res = cli("remote", "logs", job)
    assert res.code == 0 and "COMPILED" in res.output


def test_unchanged_tree_is_not_resent(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"))
    repo = small_repo(tmp_path / "repo", {"a.py": "x = 1\n"})
    first, sent_first = submit("loop", ["exit", "0"], repo)
    again, sent_again = submit("loop", ["exit", "0"], repo)
    (repo / "a.py").write_text("x = 2\n")  # an uncommitted edit is a new tree
    edited, sent_edited = submit("loop", ["exit", "0"], repo)
    assert (sent_first, sent_again, sent_edited) == (True, False, True)
    assert first.tree_id == again.tree_id != edited.tree_id
    tree = Path(edited.remote_dir).parents[1] / "trees" / edited.tree_id
    assert (tree / "a.py").read_text() == "x = 2\n"
    for job in (first, again, edited):
        assert wait_for(job).outcome == outcome.PASS


def test_exit_status_taxonomy(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"))
    make_host("broken", python=str(stub_python / "fakepython"), setup="false", workdir=str(tmp_path / "other"))
    repo = small_repo(tmp_path / "repo", {"a": ""})
    expected = {0: outcome.PASS, 1: outcome.FAIL_NUMERIC, 2: outcome.BAD_INPUT, 3: outcome.FAIL_RUNTIME,
                4: outcome.TIMEOUT, 6: outcome.FAIL_COMPILE, 139: outcome.FAIL_RUNTIME}
    submitted = {rc: submit("loop", ["exit", str(rc)], repo)[0] for rc in expected}
    broken = submit("broken", ["exit", "0"], repo)[0]
    for rc, job in submitted.items():
        assert wait_for(job).outcome == expected[rc], rc
    assert wait_for(broken).outcome == outcome.INFRA  # the setup line failed
    res = cli("remote", "status", submitted[6].id)
    assert res.code == 6 and "FAIL_COMPILE" in res.output
    res = cli("remote", "status")
    assert res.code == 0 and all(j.id in res.output for j in submitted.values())


def test_cancel_hung_job_kills_its_group_within_grace_only(make_host, stub_python, tmp_path):
    """Done-when 2: a hung job that forks children and ignores TERM is gone within the grace period;
    a GPU process that is not the job's is reported and left running."""
    grace = 2
    make_host(python=str(stub_python / "fakepython"), setup=f"export PATH={stub_python}:$PATH", kill_grace_s=grace)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (stub_python / "gpu_pids").write_text(f"{bystander.pid}\n")
    try:
        job = submit("loop", ["hang"], small_repo(tmp_path / "repo", {"a": ""}))[0]
        eventually(lambda: "hang:" in _log(job))
        pgid = int(read_remote(job, "pgid"))
        assert len(group_members(pgid)) >= 4, group_members(pgid)  # timeout, the stub, its children
        start = time.monotonic()
        res = cli("remote", "cancel", job.id)
        took = time.monotonic() - start
        assert res.code == 0, res.output
        assert took < grace + 5, took
        assert group_members(pgid) == []
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
        assert f"not of this job, left running: pid {bystander.pid}" in res.output
        assert bystander.poll() is None
        assert status(job).outcome == outcome.CANCELLED
        assert cli("remote", "status", job.id).code == 130
    finally:
        bystander.kill()
        bystander.wait()


def test_timeout_ends_as_timeout_with_no_process_left(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"), timeout_s=2, kill_grace_s=1)
    job = submit("loop", ["hang"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    st = wait_for(job, timeout_s=30)
    assert st.outcome == outcome.TIMEOUT
    rc, elapsed = map(int, read_remote(job, "exit").split())
    assert rc in outcome.TIMEOUT_RCS and elapsed >= 2
    assert group_members(int(read_remote(job, "pgid"))) == []
    assert cli("remote", "status", job.id).code == outcome.EXIT_CODES[outcome.TIMEOUT]


def test_gpu_lock_serializes_jobs(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"), gpu=0)
    repo = small_repo(tmp_path / "repo", {"a": ""})
    first = submit("loop", ["sleep", "3"], repo)[0]
    wait_for(first, lambda o: o == outcome.RUNNING)
    second = submit("loop", ["exit", "0"], repo)[0]
    assert status(second).outcome == outcome.QUEUED
    assert wait_for(second).outcome == outcome.PASS
    assert status(first).outcome == outcome.PASS
    first_end, second_start = (Path(j.remote_dir, f).stat().st_mtime for j, f in ((first, "exit"), (second, "pgid")))
    assert second_start >= first_end  # the second only started once the first had finished
    assert "export CUDA_VISIBLE_DEVICES=0\n" in read_remote(first, "job.env")


def test_lost_wrapper_is_infrastructure(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"))
    job = submit("loop", ["hang"], small_repo(tmp_path / "repo", {"a": ""}))[0]
    eventually(lambda: "hang:" in _log(job))
    os.kill(int(read_remote(job, "pid")), signal.SIGKILL)
    assert wait_for(job).outcome == outcome.INFRA
    pgid = int(read_remote(job, "pgid"))
    assert cli("remote", "cancel", job.id).code == 0
    assert group_members(pgid) == []


HOSTILE_ARGS = ["a b", "'single'", '"double"', "$(touch PWNED1)", "`touch PWNED2`", "two\nlines", "x;touch PWNED3",
                "a&&b||c|d", "*", "~", "$HOME", "back\\slash", "", " lead", "--flag=$(id)", "é ü 字", "-m"]


def test_hostile_names_run_literally(make_host, stub_python, tmp_path):
    """Done-when 4: quotes, $(), backticks, spaces and newlines in paths, args and env stay data."""
    workdir = tmp_path / "work dir 'q' \"dq\" $(touch PWNED4) `touch PWNED5`\nnewline"
    env_value = "$(touch PWNED6) 'x' \"y\"\nz"
    make_host(python=str(stub_python / "fakepython"), workdir=str(workdir), env={"HOSTILE": env_value})
    repo = small_repo(tmp_path / "repo name 'q' $(x)", {"a": ""})
    res = cli("remote", "submit", "loop", "--tree", str(repo), "--", "argv", *HOSTILE_ARGS)
    assert res.code == 0, res.output
    job = load(_job_id(res.output))
    assert wait_for(job).outcome == outcome.PASS
    out = Path(job.remote_dir, "out")
    assert (out / "argv.bin").read_bytes() == b"".join(a.encode() + b"\0" for a in HOSTILE_ARGS)
    assert (out / "env.bin").read_bytes() == env_value.encode()
    assert Path(job.remote_dir).parent.parent == workdir
    assert Path(job.remote_dir, "job.env").stat().st_mode & 0o077 == 0  # env may hold secrets
    pwned = [*tmp_path.rglob("PWNED*"), *Path.home().glob("PWNED*")]
    assert pwned == []


def _log(job) -> str:
    path = Path(job.remote_dir, "output.log")
    return path.read_text() if path.exists() else ""


def test_cancel_queued_job_and_prune_old_jobs(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"), gpu=0, keep_jobs=1)
    repo = small_repo(tmp_path / "repo", {"a": ""})
    holder = submit("loop", ["hang"], repo)[0]
    eventually(lambda: "hang:" in _log(holder))
    queued = submit("loop", ["exit", "0"], repo)[0]
    eventually(lambda: status(queued).outcome == outcome.QUEUED)
    waiter = int(read_remote(queued, "pid"))
    assert cli("remote", "cancel", queued.id).code == 0
    assert status(queued).outcome == outcome.CANCELLED
    eventually(lambda: group_members(waiter) == [], timeout_s=5)  # the wrapper and its flock are gone
    assert cli("remote", "cancel", holder.id).code == 0
    trees = Path(holder.remote_dir).parents[1] / "trees"
    two_hours_ago = time.time() - 7200
    for name in ("0ld", "fresh", holder.tree_id):
        (trees / name).mkdir(exist_ok=True)
        if name != "fresh":
            os.utime(trees / name, (two_hours_ago, two_hours_ago))
    last = submit("loop", ["exit", "0"], repo)[0]
    jobs_dir = Path(last.remote_dir).parent
    assert sorted(p.name for p in jobs_dir.iterdir()) == [queued.id, last.id]  # keep_jobs=1 plus the new one
    assert sorted(p.name for p in trees.iterdir()) == sorted(["fresh", last.tree_id])  # old and unused: gone


def test_unreachable_host_is_infrastructure(make_host, tmp_path, sshd):
    config = tmp_path / "ssh_config_closed"
    write_ssh_config(config, sshd.root, 1)  # nothing listens on port 1
    make_host(ssh_config=str(config))
    res = cli("remote", "submit", "loop", "--tree", str(small_repo(tmp_path / "repo", {"a": ""})), "--", "sweep", "x")
    assert res.code == outcome.EXIT_CODES[outcome.INFRA]
    assert "infrastructure: cannot reach host 'loop' (ssh loopback)" in res.output


def test_large_log_streams_whole_and_in_order(make_host, stub_python, tmp_path):
    make_host(python=str(stub_python / "fakepython"))
    lines = 250_000  # 3.2 MB: several SFTP reads
    job = submit("loop", ["bulk", str(lines)], small_repo(tmp_path / "repo", {"a": ""}))[0]
    res = cli("remote", "logs", job.id, "--follow")
    assert res.code == 0
    expected = "".join(f"line {i}\n" for i in range(1, lines + 1))
    assert res.output.startswith(expected) and res.output[len(expected):].startswith("job ")
