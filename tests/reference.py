"""The CPU reference check the family tests share: the low-precision reference of a case against
its FP32 oracle by the family's tolerance rule."""

from __future__ import annotations

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family


def check_reference(case: Case, outputs: dict | None = None) -> tuple[bool, dict, CaseData]:
    """(passed, metrics, data) of `outputs` (default: the low-precision reference) on the CPU."""
    fam = get_family(case.family)
    data = CaseData(fam, case, "cpu")
    ok, metrics = compare_outputs(data.lowprec if outputs is None else outputs, data.oracle, data.lowprec,
                                  lambda n: fam.tolerance_for(case, n))
    return ok, metrics, data


def run_reference(case: Case) -> tuple[CaseData, dict]:
    """The reference check, asserted to pass."""
    ok, metrics, data = check_reference(case)
    assert ok, {k: m.reasons for k, m in metrics.items()}
    return data, metrics
