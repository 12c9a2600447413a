"""`bench-model` (dsv4bench/model/speed.py) on the CPU with the tiny checkpoint: per backend and phase a
JSONL record whose per-op times fit inside the phase's, speedup records of the first backend against
the others; and `run-model --backend cutedsl --compare` names every op not on a kernel with its reason."""

from __future__ import annotations

import json
import random

import typer
from typer.testing import CliRunner

from dsv4bench.cli.model import register
from dsv4bench.model.dispatch import ORACLE_ONLY, register_kernel_ops

app = typer.Typer()
register(app)


@app.callback()
def _root():
    pass


def test_bench_model_writes_phase_and_speedup_records(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path / "cache"))
    prefill, decode, batch = random.randint(5, 20), random.randint(2, 6), random.randint(1, 3)
    r = CliRunner().invoke(app, ["bench-model", "--config", "tiny", "--device", "cpu", "--prefill", str(prefill),
                                 "--decode", str(decode), "--batch", str(batch), "--backends", "oracle,lowprec",
                                 "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    phases = {(x["backend"], x["phase"]): x for x in records if x["kind"] == "phase"}
    assert set(phases) == {(b, p) for b in ("oracle", "lowprec") for p in ("prefill", "decode")}
    for (backend, phase), x in phases.items():
        assert x["tokens"] == batch * (prefill if phase == "prefill" else decode)
        assert x["ops"]["hc_pre"]["calls"] > 0 and 0 < sum(o["share"] for o in x["ops"].values()) <= 1.0
        assert ("sample" in x["ops"]) == (phase == "decode")
    speedups = [x for x in records if x["kind"] == "speedup"]
    assert {(x["backend"], x["baseline"], x["phase"]) for x in speedups} == {("oracle", "lowprec", "prefill"),
                                                                           ("oracle", "lowprec", "decode")}
    for x in speedups:
        want = phases[("lowprec", x["phase"])]["seconds"] / phases[("oracle", x["phase"])]["seconds"]
        assert abs(x["speedup"] - want) < 1e-9
    assert "prefill: oracle is" in r.output and "decode: oracle is" in r.output


def test_compare_on_the_kernel_backend_names_every_op_not_on_a_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(app, ["run-model", "--prompt", "Hi", "--max-new-tokens", "2", "--backend", "cutedsl",
                                 "--compare"], terminal_width=400)
    assert r.exit_code == 0, r.output
    register_kernel_ops()
    rows = _table_rows(r.output)
    for op, why in ORACLE_ONLY.items():
        assert rows[op] == f"oracle ({' '.join(why.split())})", op


def _table_rows(output: str) -> dict[str, str]:
    """The first table's rows, op -> its second cell (rich wraps a long cell onto continuation lines)."""
    rows: dict[str, str] = {}
    last = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 2:
            if rows and line.startswith("└"):
                break
            continue
        if cells[0]:
            last = cells[0]
            rows[last] = cells[1]
        elif last is not None:
            rows[last] += " " + cells[1]
    return rows
