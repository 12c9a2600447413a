"""Done-when 5: the Slurm backend over the loopback sshd, with stub sbatch/sacct/scancel: a 4-shard
array runs, is tracked, and merges into one run directory; scancel'd arrays end as CANCELLED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.remote import outcome
from dsv4bench.remote.registry import load
from tests.remote.conftest import group_members
from tests.remote.helpers import cli, eventually, read_remote, small_repo, status, wait_for


@pytest.fixture
def cluster(make_host, stub_python, tmp_path):
    make_host("cluster", backend="slurm", slurm_bin=str(stub_python), python=str(stub_python / "fakepython"),
              sbatch=["--partition=gpu", "--gres=gpu:1"], workdir=str(tmp_path / "cluster"))
    return small_repo(tmp_path / "repo", {"a": ""})


def _submit(repo, *args: str):
    res = cli("remote", "submit", "cluster", "--tree", str(repo), *args)
    assert res.code == 0, res.output
    return load(res.output.split("submitted ")[1].split()[0]), res.output


def test_four_shard_array_runs_is_tracked_and_merges(cluster, tmp_path):
    job, out = _submit(cluster, "--shards", "4", "--follow", "--", "sweep", "rmsnorm", "--out", "run")
    assert job.slurm_id and job.tasks == 4 and "4 tasks" in out
    assert "shard 0/4: 2 records" in out and f"job {job.id} on cluster: PASS" in out  # followed task 0 to the end
    st = wait_for(job, timeout_s=60)
    assert st.outcome == outcome.PASS and sorted(st.tasks) == [f"task-{i}" for i in range(4)]
    for i in range(4):  # each task ran its own shard
        assert f"shard {i}/4: 2 records" in read_remote(job, f"task-{i}", "output.log")
    res = cli("remote", "status", job.id)
    assert res.code == 0 and "PASS" in res.output
    dest = tmp_path / "fetched"
    res = cli("remote", "fetch", job.id, "--dest", str(dest))
    assert res.code == 0, res.output
    merged = dest / "merged"
    records = [json.loads(line) for line in (merged / "results.jsonl").read_text().splitlines()]
    assert sorted(r["case_id"] for r in records) == sorted(f"rmsnor-{i}{k}" for i in range(4) for k in (0, 1))
    assert {r["run_id"] for r in records} == {"merged"}
    meta = json.loads((merged / "run.json").read_text())
    assert len(meta["cases"]) == 8 and len(meta["shards"]) == 4 and len(meta["invocations"]) == 4
    assert len((merged / "results.csv").read_text().splitlines()) == 9
    assert (merged / "index.html").exists()


def test_scancel_stops_the_array(cluster):
    job, _ = _submit(cluster, "--", "hang")
    eventually(lambda: "hang:" in _log(job))
    pgid = int(read_remote(job, "task-0", "pgid"))
    res = cli("remote", "cancel", job.id)
    assert res.code == 0, res.output
    assert wait_for(job, timeout_s=20).outcome == outcome.CANCELLED
    eventually(lambda: group_members(pgid) == [], timeout_s=5)
    assert status(job).tasks == {"task-0": outcome.CANCELLED}


def test_shards_need_a_slurm_sweep(cluster, make_host):
    res = cli("remote", "submit", "cluster", "--tree", str(cluster), "--shards", "2", "--", "repro", "x")
    assert res.code == 2 and "--shards N needs a slurm host" in res.output


def _log(job) -> str:
    path = Path(job.remote_dir, "task-0", "output.log")
    return path.read_text() if path.exists() else ""
