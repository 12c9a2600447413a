"""`dsv4bench repro CASE_ID` on a case a real sweep failed: diagnostics, commands, exit status."""

from __future__ import annotations

import sys

import pytest

import planted
from dsv4bench.core.case import Case

FAILING = Case("planted", {"m": 3, "n": planted.BUGGY_WIDTH}, seed=5)


def test_repro_shows_worst_elements_histogram_and_commands():
    runs = planted.two_runs()
    res = planted.dsv4bench(runs.regressions, "repro", FAILING.id, "--runs", str(runs.first))
    out = res.stdout
    assert res.returncode == 1, out + res.stderr  # the planted bug reproduces
    assert f"found in: {runs.first}" in out
    assert "made by:  dsv4bench sweep planted --out" in out and "--width 8,13 --seed 5" in out
    assert f"replay:   dsv4bench repro {FAILING.id} --runs {runs.first.resolve()}" in out
    # worst elements side by side: the planted column (last, index 12) of each of the 3 rows comes first
    worst = [line for line in out.splitlines() if "[0, 12]" in line or "[1, 12]" in line or "[2, 12]" in line]
    assert len(worst) >= 3
    assert "histogram" in out and "[1e+00, 1e+01)" in out


def test_repro_finds_a_case_in_the_regression_file_alone(tmp_path):
    runs = planted.two_runs()
    res = planted.dsv4bench(runs.regressions, "repro", FAILING.id, "--runs", str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"found in: {runs.regressions / 'planted.jsonl'}" in res.stdout


def test_repro_unknown_case_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from dsv4bench.cli import main as cli_main

    monkeypatch.setenv("DSV4BENCH_REGRESSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["dsv4bench", "repro", "nosuch-0000000000", "--runs", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    out = capsys.readouterr().out
    assert exc.value.code == 2
    assert out.startswith("error: case 'nosuch-0000000000' not found") and "Traceback" not in out
