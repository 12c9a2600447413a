"""benchmarks/moe_stages.py: a peer is timed whole (it compiles nothing; its compile would raise), ours compiled."""

import importlib.util
from pathlib import Path

import pytest

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


def test_phase_timelines_count_only_the_ctas_that_wrote_a_stamp(monkeypatch):
    """benchmarks/moe_phases.py: times from L1's earliest entry; a CTA with no item (idle at one token) writes entry
    and work list stamps only, and its unwritten ones are left out, not read as 0."""
    import sys

    import torch

    from kernels.moe.grouped_config import STAMP_CTAS, STAMP_SLOTS
    bench = Path(__file__).parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location("moe_phases", bench / "moe_phases.py")
    phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phases)
    words = torch.zeros(2 * STAMP_CTAS * STAMP_SLOTS, dtype=torch.int32)
    words[:6] = torch.tensor([1000, 2000, 3000, 4000, 5000, 7000])  # a working L1 CTA
    words[STAMP_SLOTS:STAMP_SLOTS + 2] = torch.tensor([3000, 4000])  # an idle one
    words[STAMP_CTAS * STAMP_SLOTS:STAMP_CTAS * STAMP_SLOTS + 6] = torch.tensor([6000, 7000, 8000, 9000, 9500, 9900])
    got = phases.timelines(words)
    assert got["l1"]["ctas"] == 2 and got["l1"]["entry"] == (1.0, 2.0) and got["l1"]["exit"] == (6.0, 6.0)
    assert got["l2"]["first_full"] == (8.0, 8.0) and "moe_stages" in sys.modules


def test_the_scripts_options_refuse_bad_input_in_one_line(monkeypatch, capsys):
    stages = importlib.util.module_from_spec(SPEC)
    SPEC.loader.exec_module(stages)
    for argv, cap, want in ((["--tokens", "1,x"], None, "integers"), (["--tokens", "0"], None, ">= 1"),
                            (["--tokens", "65"], 64, "1..64"), (["--experts", "999"], None, "1..256")):
        monkeypatch.setattr("sys.argv", ["moe_stages.py", *argv])
        with pytest.raises(SystemExit):
            stages.layer_args(stages.layer_parser("x", "1", "case"), cap)
        assert want in capsys.readouterr().err.splitlines()[-1]
