"""Each layout lint flags its planted bug in a real sm_90a compile, passes the correct twin, and
fails the case with FAIL_LINT in the worker, also when the kernel comes from the disk cache."""

from __future__ import annotations

import pytest
from cutlass.cute import sym_int
from planted_kernels import BUGS, PlantedImpl, compile_planted

from dsv4bench.compile.lints import lint
from kernels.trace import Recording, record, recording
from dsv4bench.compile.store import DiskStore
from dsv4bench.core.case import Case
from dsv4bench.core.results import COMPILED, FAIL_LINT, ResultRecord
from dsv4bench.core.worker import Worker

RULE_OF = {"slice": "tma-tile-mode", "tx": "tx-count", "arrive": "arrive-count"}


def lint_compile(bug, n_kv=256):
    with recording() as rec:
        compile_planted(bug, n_kv)
    return rec, lint(rec)


def test_correct_twin_passes_every_lint_and_records_its_stages():
    rec, findings = lint_compile(None)
    assert findings == []
    stages = [e["stage"] for e in rec.entries]
    for stage in ("smem K/V staged", "TMA atom K", "KV stage", "sK", "K tile after TMA partition"):
        assert stage in stages
    assert sorted({f["rule"] for f in rec.facts}) == ["arrive-count", "tma-tile-mode", "tx-count"]
    k = next(e for e in rec.entries if e["stage"] == "K tile after TMA partition")["fields"]
    assert k["layout"].startswith("(((64,64),1),1,4,1)") and k["after slice"].startswith("(((64,64),1),4)")
    sk = next(e for e in rec.entries if e["stage"] == "sK")["fields"]
    assert sk["swizzle"] == "S<3,4,3>" and sk["memory"] == "smem"


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_flagged_by_exactly_its_lint(bug):
    _, findings = lint_compile(bug)
    assert [f.rule for f in findings] == [RULE_OF[bug]]
    message = findings[0].message
    if bug == "slice":
        assert findings[0].stage == "K tile after TMA partition"
        assert "(_,_,0,0) pins mode 2" in message and "4 tiles" in message
    elif bug == "tx":
        assert "tx_count 8192 B" in message and "16384 B (K 8192 + V 8192)" in message
    else:
        assert findings[0].stage == "done" and "given in warps instead of threads" in message
        assert "arrive 128 times" in message


def test_tile_mode_lint_needs_more_than_one_tile():
    _, one_tile = lint_compile("slice", n_kv=64)  # a single KV tile: the slice is harmless
    assert one_tile == []
    _, dynamic = lint_compile("slice", n_kv=sym_int())  # unknown tile count: may be many
    assert [f.rule for f in dynamic] == ["tma-tile-mode"] and "a dynamic number of" in dynamic[0].message


@pytest.mark.parametrize("pipeline, count, multicast, flagged", [
    ("PipelineUmmaAsync", 4, 1, "given in warps instead of threads"),  # the seed's bug
    ("PipelineUmmaAsync", 128, 1, None),
    ("PipelineTmaAsync", 128, 1, "given in threads instead of warps"),
    ("PipelineTmaAsync", 8, 2, None),  # one lane per warp per multicast CTA: 4 warps x 2 CTAs
    ("PipelineTmaAsync", 4, 2, "arrive 8 times"),  # multicast fan-in forgotten
    ("PipelineTmaUmma", 1, 1, None),  # the consumer is the MMA: no thread count to check
])
def test_arrive_count_rule_by_pipeline_class(pipeline, count, multicast, flagged):
    rec = Recording(facts=[{"rule": "arrive-count", "stage": "s", "pipeline": pipeline, "count": count,
                            "warps": 4, "multicast": multicast}])
    findings = lint(rec)
    if flagged is None:
        assert findings == []
    else:
        assert len(findings) == 1 and flagged in findings[0].message


def test_recorder_is_a_no_op_when_off():
    assert record("anything", object()) is None
    compile_planted("slice")  # record_tma_slice still slices with nothing recording
    with recording() as rec:
        pass
    assert rec.entries == [] and rec.facts == []


def compile_record(worker, bug):
    case = Case("planted", {"bug": bug})
    rec = ResultRecord(run_id="t", task="t", case_id=case.id, family="planted", impl="cutedsl", backend="cutedsl",
                       arch="sm_90a", mode="compile", device="cpu", params=dict(case.params), seed=0, origin="cli",
                       status="")
    worker.compile(rec, PlantedImpl(), case, "sm_90a")
    return rec


def test_worker_fails_a_linted_case_also_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_CACHE_DIR", str(tmp_path))
    first = Worker()
    assert compile_record(first, None).status == COMPILED
    bad = compile_record(first, "tx")
    assert bad.status == FAIL_LINT and bad.reason.startswith("tx-count [KV stage]: tx_count 8192 B")
    assert bad.compile["cache"] == "miss"
    again = compile_record(Worker(), "tx")  # a fresh process: loaded from disk, lints re-run on stored facts
    assert again.compile["cache"] == "disk" and again.status == FAIL_LINT and again.reason == bad.reason
    assert len(list(DiskStore(tmp_path / "kernels").entries())) == 2
