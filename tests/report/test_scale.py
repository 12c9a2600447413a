"""Done-criterion: a 500-case run renders (index.html + results.csv) in under 10 s on a CPU box."""

from __future__ import annotations

import time

import report_synth
from dsv4bench.report.build import write_report

BUDGET_S = 10.0


def test_500_cases_render_under_10_s(tmp_path):
    run, cases = report_synth.make_run(tmp_path / "big", 500, failing=tuple(range(0, 500, 50)))
    t0 = time.perf_counter()
    report = write_report(run.path)
    seconds = time.perf_counter() - t0
    print(f"500 cases / 1500 results rendered in {seconds:.2f} s")
    assert seconds < BUDGET_S
    html = report.index.read_text()
    assert html.count('class="failure"') == 10 and all(c.id in html for c in cases)
    assert len(report.csv.read_text().splitlines()) == 1 + 1500
