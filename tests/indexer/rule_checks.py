"""The CPU check both logits ops (prefill, decode) run on their cases: the low-precision reference
and the torch peer pass the harness rule against the oracle, and a wrong answer on a visible logit
fails it."""

from __future__ import annotations

import torch

from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family, get_impl


def check_lowprec_torch_and_a_wrong_answer(case) -> tuple[CaseData, dict]:
    """Returns the case's data and the torch peer's output (for the caller's own checks)."""
    family = get_family("indexer")
    data = CaseData(family, case, "cpu")
    tol = lambda n: family.tolerance_for(case, n)  # noqa: E731
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, tol)
    assert ok, metrics["logits"].summary()
    out = get_impl("indexer", "torch").run(case, data.inputs, {}, None)
    ok, metrics = compare_outputs(out, data.oracle, data.lowprec, tol)
    assert ok, metrics["logits"].summary()
    ref = data.oracle["logits"]
    visible = torch.nonzero(torch.isfinite(ref.view(-1))).view(-1)
    if visible.numel():
        wrong = data.lowprec["logits"].clone()
        wrong.view(-1)[visible[visible.numel() // 2]] += 1.0 + 4 * float(ref[torch.isfinite(ref)].abs().max())
        assert not compare_outputs({"logits": wrong}, data.oracle, data.lowprec, tol)[0]
    return data, out
