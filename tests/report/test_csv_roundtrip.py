"""results.csv holds every field of every record and reads back to the JSONL records exactly."""

from __future__ import annotations

import csv
import json
import math

import planted
import report_synth
from dsv4bench.core.results import ResultRecord, RunDir, flatten, read_csv, unflatten


def _canon(records: list[ResultRecord]) -> list[str]:
    # JSON text compares NaN with NaN and floats by their shortest repr, i.e. bit for bit
    return [json.dumps(r.to_json(), sort_keys=True) for r in records]


def test_real_sweep_run_round_trips():
    run = RunDir(planted.two_runs().second)
    records = run.records()
    assert records and any(r.metrics for r in records)
    assert _canon(read_csv(run.write_csv())) == _canon(records)


def test_timed_run_round_trips_to_the_last_bit(tmp_path):
    run, _ = report_synth.make_run(tmp_path / "run", 12, failing=(0, 1))
    records = run.records()
    back = read_csv(run.write_csv())
    assert _canon(back) == _canon(records)
    samples = [s for r in back if r.timing for s in r.timing["samples_ms"]]
    assert samples and all(isinstance(s, float) for s in samples)


def test_awkward_values_survive(tmp_path):
    rec = report_synth.record("r", report_synth.cases(1)[0], "cutedsl", "cutedsl", 1.0, False,
                              __import__("random").Random(0))
    rec.params = {"a": "", "b": "7", "c": "null", "d": [1, 2.5], "e": 0.1 + 0.2, "f": math.nan, "g": "True",
                  "h": '"quoted"', "i": None, "j": 10**30, "k": 5e-324, "l": "x,y\nz", "m": -math.inf, "n": True,
                  "o": "1_000", "p": " 3", "q": {"nested": [math.inf]}}
    rec.reason = "3.5"
    rec.log = "line one\nline two, with a comma and \"quotes\""
    rec.metrics["out"]["bound"] = None
    assert _canon([unflatten(flatten(rec))]) == _canon([rec])
    run = RunDir(tmp_path / "awkward").create()
    run.append(rec)
    assert _canon(read_csv(run.write_csv())) == _canon([rec])


def test_columns_carry_units_and_full_precision(tmp_path):
    run, _ = report_synth.make_run(tmp_path / "run", 3, failing=())
    with open(run.write_csv(), newline="") as f:
        rows = list(csv.DictReader(f))
    cols = set(rows[0])
    assert {"time.median_ms", "time.p10_ms", "time.p90_ms", "time.iters", "perf.tflops", "perf.gbps",
            "perf.pct_copy", "err.out.max_abs", "param.hd", "seed", "status", "case_id"} <= cols
    median = run.records()[0].timing["median_ms"]
    assert float(rows[0]["time.median_ms"]) == median and rows[0]["time.median_ms"] == repr(median)


def test_mode_and_time_have_csv_names_of_their_own(tmp_path):
    run, _ = report_synth.make_run(tmp_path / "run", 3, failing=())
    records = run.records()
    with open(run.write_csv(), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"task_mode", "recorded_at_epoch_s"} <= set(rows[0]) and not {"mode", "time"} & set(rows[0])
    assert [(r["task_mode"], r["recorded_at_epoch_s"]) for r in rows] == [(r.mode, repr(r.time)) for r in records]
    assert _canon(read_csv(run.csv)) == _canon(records)


def test_csv_with_the_old_mode_and_time_columns_still_reads(tmp_path):
    run, _ = report_synth.make_run(tmp_path / "run", 3, failing=(0,))
    records = run.records()
    with open(run.write_csv(), newline="") as f:
        rows = list(csv.reader(f))
    old = {"task_mode": "mode", "recorded_at_epoch_s": "time"}
    rows[0] = [old.get(c, c) for c in rows[0]]
    with open(run.csv, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert {"mode", "time"} <= set(rows[0])
    assert _canon(read_csv(run.csv)) == _canon(records)
