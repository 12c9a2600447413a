"""Regression memory: failing cases land in the family's JSONL file and replay first next time."""

from __future__ import annotations

import json

import pytest

import planted
from dsv4bench.core import regressions
from dsv4bench.core.case import Case
from dsv4bench.core.results import COMPILED, FAIL_COMPILE, FAIL_NUMERIC, PASS, TIMEOUT, ResultRecord


@pytest.fixture
def regdir(tmp_path, monkeypatch):
    d = tmp_path / "regressions"
    monkeypatch.setenv(regressions.ENV_DIR, str(d))
    return d


def _rec(case: Case, status: str, impl: str = "cutedsl", reason: str = "") -> ResultRecord:
    return ResultRecord(run_id="r", task=f"{case.id}|{impl}|sm_90a|run", case_id=case.id, family=case.family,
                        impl=impl, backend=impl, arch="sm_90a", mode="run", device="cuda", params=dict(case.params),
                        seed=case.seed, origin=case.origin, status=status, reason=reason,
                        metrics={"out": {"passed": False, "max_abs": 0.5, "bound": 0.01, "rel_l2": 0.2,
                                         "worst_index": [3, 127]}} if status == FAIL_NUMERIC else {})


def test_env_dir_overrides_the_checked_in_one(regdir):
    assert regressions.regression_file("fmha") == regdir / "fmha.jsonl"


def test_default_dir_is_the_checked_in_sweeps_regressions(monkeypatch):
    monkeypatch.delenv(regressions.ENV_DIR, raising=False)
    d = regressions.regressions_dir()
    assert d.parts[-2:] == ("sweeps", "regressions")


def test_failures_are_appended_once_with_their_summary(regdir, tmp_path):
    run_file = tmp_path / "run" / regressions.RUN_FILE
    bad = Case("fmha", {"hd": 512, "s_kv": 65}, seed=3)
    slow = Case("fmha", {"hd": 64, "s_kv": 1}, seed=3)
    good = Case("fmha", {"hd": 128, "s_kv": 64}, seed=3)
    records = [_rec(bad, FAIL_NUMERIC, reason="max|err| 0.5 > bound 0.01"), _rec(bad, FAIL_COMPILE, impl="x"),
               _rec(slow, TIMEOUT), _rec(good, PASS), _rec(good, COMPILED)]
    added = regressions.record_failures("fmha", records, "abc1234", "dsv4bench sweep fmha", run_file)
    assert added == [bad.id, slow.id]
    # a resumed sweep failing the same case again adds nothing; the checked-in file is not written
    assert regressions.record_failures("fmha", records, "def5678", "dsv4bench sweep fmha", run_file) == []
    assert not (regdir / "fmha.jsonl").exists()
    lines = run_file.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["params"] == {"hd": 512, "s_kv": 65} and first["seed"] == 3 and first["case_id"] == bad.id
    assert first["status"] == FAIL_NUMERIC and first["commit"] == "abc1234" and first["date"].endswith("Z")
    assert first["error"]["reason"] == "max|err| 0.5 > bound 0.01"
    assert first["error"]["outputs"]["out"]["worst_index"] == [3, 127]


def test_other_families_records_are_not_recorded(regdir, tmp_path):
    other = Case("rmsnorm", {"m": 1, "n": 8})
    assert regressions.record_failures("fmha", [_rec(other, FAIL_NUMERIC)], None, "", tmp_path / "r.jsonl") == []
    assert not (tmp_path / "r.jsonl").exists()


def test_regression_cases_come_first_and_once(regdir, tmp_path):
    old = Case("fmha", {"hd": 512, "s_kv": 65}, seed=3)
    regressions.record_failures("fmha", [_rec(old, FAIL_NUMERIC)], None, "", tmp_path / "r.jsonl")
    regressions.promote("fmha", regressions.read_entries(tmp_path / "r.jsonl"), None, False, 300.0)
    with open(regdir / "fmha.jsonl", "a") as f:  # a duplicated line and a broken hand edit
        f.write((regdir / "fmha.jsonl").read_text() + "{not json\n")
    grid = [Case("fmha", {"hd": 64, "s_kv": 1}, seed=3), Case("fmha", {"hd": 512, "s_kv": 65}, seed=3, origin="grid")]
    cases = regressions.with_regressions("fmha", grid)
    assert [c.id for c in cases] == [old.id, grid[0].id]
    assert cases[0].origin == "regression"


def test_planted_failure_is_recorded_then_replayed_first():
    """Two real sweeps: the first meets the planted bug (recorded in its run directory, promoted
    by `regressions add`), the second (whose own cases avoid it) replays it first from the
    regression file."""
    runs = planted.two_runs()
    first, second = runs.first_result, runs.second_result
    assert first.returncode == 1, first.stdout + first.stderr  # FAIL_NUMERIC
    entries = [json.loads(line) for line in (runs.regressions / "planted.jsonl").read_text().splitlines()]
    failing = Case("planted", {"m": 3, "n": planted.BUGGY_WIDTH}, seed=5)
    assert [e["case_id"] for e in entries] == [failing.id]
    assert entries[0]["params"] == {"m": 3, "n": 13} and entries[0]["status"] == "FAIL_NUMERIC"
    assert "relative L2" in entries[0]["error"]["reason"]
    assert "new to the regression file" in first.stdout and "regressions add" in first.stdout

    assert second.returncode == 1, second.stdout + second.stderr  # the bug is still there
    assert "1 regression case(s) replayed first" in second.stdout
    records = [json.loads(line) for line in (runs.second / "results.jsonl").read_text().splitlines()]
    assert records[0]["case_id"] == failing.id and records[0]["origin"] == "regression"
    assert records[0]["status"] == "FAIL_NUMERIC"
    assert {r["case_id"] for r in records[1:]} == {Case("planted", p, seed=5).id for p in planted.GRID}
    assert len((runs.regressions / "planted.jsonl").read_text().splitlines()) == 1  # replayed, not re-added
    assert (runs.second / "index.html").exists()  # the sweep rendered its report
    assert not (planted.REPO / "sweeps" / "regressions" / "planted.jsonl").exists()  # the repo stays clean
