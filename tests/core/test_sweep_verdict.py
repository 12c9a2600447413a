"""The sweep's exit status (dsv4bench/cli/summary.py): our kernels' records decide it, not a peer's (router sweeps
exited 1 on torch.compile's k = 1 weights, 2 ulps off, every kernel record PASS)."""

from __future__ import annotations

from dsv4bench.cli.summary import EXIT_CODES, exit_code
from dsv4bench.core.results import FAIL_NUMERIC, PASS, TIMEOUT, ResultRecord


def _rec(impl: str, backend: str, status: str) -> ResultRecord:
    return ResultRecord("r", f"c|{impl}|sm_90a|run", "c", "router", impl, backend, "sm_90a", "run", "cuda", {}, 0,
                        "grid", status)


def test_a_failing_peer_beside_passing_kernels_exits_0():
    records = [_rec("cutedsl", "cutedsl", PASS), _rec("torch_compile", "torch_compile", FAIL_NUMERIC),
               _rec("flashmla", "flashmla", TIMEOUT)]
    assert exit_code(records) == 0


def test_a_failing_kernel_or_variant_decides():
    assert exit_code([_rec("cutedsl", "cutedsl", PASS), _rec("cutedsl:v11", "cutedsl", FAIL_NUMERIC),
                      _rec("torch", "torch", PASS)]) == EXIT_CODES[FAIL_NUMERIC]
    assert exit_code([_rec("cutedsl", "cutedsl", TIMEOUT), _rec("torch", "torch", FAIL_NUMERIC)]) == EXIT_CODES[TIMEOUT]


def test_a_record_no_worker_could_attribute_decides():
    assert exit_code([_rec("cutedsl", "cutedsl", PASS), _rec("kernel", "", TIMEOUT)]) == EXIT_CODES[TIMEOUT]


def test_a_sweep_of_peers_alone_is_judged_on_them():
    assert exit_code([_rec("torch", "torch", FAIL_NUMERIC)]) == EXIT_CODES[FAIL_NUMERIC]
    assert exit_code([_rec("torch", "torch", PASS)]) == 0
