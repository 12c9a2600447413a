"""The report of a real sweep run, opened in headless Chromium: screenshot and DOM."""

from __future__ import annotations

import json
import shutil
import subprocess

import matplotlib.image
import pytest

import planted
import report_synth
from dsv4bench.core.case import Case
from dsv4bench.report.build import write_report
from html_check import decode_png, find, parse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")


# Test-only: measures the rendered page and writes the result into the DOM for --dump-dom (the
# report itself carries no script). An element overflows when its content is wider than its box.
PROBE = """<script>
window.addEventListener("load", () => {
  const sel = "#speed *, #legend *, table.perf td, table.perf th, table.classes td, #unsupported td";
  const over = [...document.querySelectorAll(sel)].filter(e => e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0)
    .map(e => e.tagName + "." + e.className + ": " + e.textContent.slice(0, 60));
  const page = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  document.body.setAttribute("data-probe", JSON.stringify({over, page}));
});
</script>"""


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,2200"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def real_report(tmp_path_factory):
    run = tmp_path_factory.mktemp("browser") / "run"
    shutil.copytree(planted.two_runs().second, run)
    (run / "index.html").unlink()
    return write_report(run)


def test_report_of_a_real_sweep_in_chromium(real_report, tmp_path):
    url = real_report.index.resolve().as_uri()
    shot = tmp_path / "report.png"
    res = chromium(tmp_path, f"--screenshot={shot}", url)
    assert shot.exists(), res.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2200, 1400)
    assert pixels.std() > 0.05  # a rendered page, not a blank one

    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    els = parse(dom.stdout)
    summary = find(els, "section", id="summary")
    assert summary and "1 failing result in 1 case" in summary[0].text and "7 cases" in summary[0].text
    assert "FAIL_NUMERIC 1" in summary[0].text and "PASS 6" in summary[0].text
    imgs = find(els, "img", "heatmap")
    assert imgs and decode_png(imgs[0].attrs["src"]).std() > 0.05

    failing = Case("planted", {"m": 3, "n": planted.BUGGY_WIDTH}, seed=5).id
    rows = find(els, "tr", "failure")
    assert [r.attrs["data-case-id"] for r in rows] == [failing]
    assert f"dsv4bench repro {failing} --runs {real_report.index.parent.resolve()} --impl torch" in rows[0].text
    assert "regression" in rows[0].text  # it came back from the regression file


@pytest.fixture(scope="module")
def timed_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser-timed") / "run"
    report_synth.make_run(path, 12, failing=(0,))
    return write_report(path)


def test_speed_summary_legend_and_no_overflow_in_chromium(timed_report, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(timed_report.index.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    els = parse(dom.stdout)
    speed = find(els, "section", id="speed")
    assert speed and "speedup = peer time / our time" in speed[0].text and "> 1 means ours is faster" in speed[0].text
    peers = {e.attrs["data-peer"]: e.text for e in find(els, "div", "peer")}
    assert set(peers) == {"flashmla", "torch"}
    assert "ours faster than torch" in peers["torch"] and "11 wins, 0 losses" in peers["torch"]
    legend = find(els, "div", id="legend")[0].text
    assert "ours faster" in legend and "ours slower" in legend and "NOISY" in legend
    assert [e.attrs["data-impl"] for e in find(els, "span", "impl-swatch")] == ["cutedsl", "flashmla", "torch"]
    measured = json.loads(find(els, "body")[0].attrs["data-probe"])
    assert measured["over"] == [], measured["over"][:5]
    assert measured["page"] <= 0, f"the page scrolls sideways by {measured['page']} px"
