"""benchmarks/moe_stages.py: a peer is timed whole (it compiles nothing; its compile would raise), ours compiled."""

import importlib.util
from pathlib import Path

from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_impl, load_families
from sweeps.moe import case as moe_case

SPEC = importlib.util.spec_from_file_location("moe_stages", Path(__file__).parents[2] / "benchmarks" / "moe_stages.py")


def test_peers_compile_nothing_ours_compile_their_layer(monkeypatch):
    stages = importlib.util.module_from_spec(SPEC)
    SPEC.loader.exec_module(stages)
    load_families()
    case = Case("moe", moe_case("layer", "flash", 8, "uniform"), seed=0, origin="cli")
    assert stages.compiled_or_none(get_impl("moe", "deepgemm-kernels"), case) is None
    ours = get_impl("moe", "cutedsl")
    monkeypatch.setattr(type(ours), "compile", lambda self, c, arch: ("compiled", c["t"], arch))
    assert stages.compiled_or_none(ours, case) == ("compiled", 8, "sm_90a")
