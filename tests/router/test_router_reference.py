"""Router on the CPU: the torch peer (the low-precision reference) against the FP32 oracle, and the
bias changing the selection but not the weights."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family
from sweeps import router as rspace
from tests.reference import run_reference

@pytest.mark.parametrize("params", [rspace.case(257, 384, 2.5, False), rspace.case(64, 256, 1.5, True),
                                    rspace.case(3, 40, 1.0, False, k=8)], ids=str)
def test_router_peer_matches_the_oracle(params):
    data, metrics = run_reference(Case("router", params, 4))
    w, idx = data.oracle["weights"], data.oracle["indices"]
    assert torch.allclose(w.sum(-1), torch.full_like(w[:, 0], params["scale"]), rtol=1e-12)  # fp64 truth
    assert int(idx.min()) >= 0 and int(idx.max()) < params["e"]
    from kernels.router.eager import route_from_logits

    peer = route_from_logits(data.inputs["logits"], data.inputs.get("bias"), data.inputs.get("tid2eid"),
                             data.inputs.get("input_ids"), params["k"], params["scale"])
    assert torch.equal(peer["indices"].long(), idx)
    assert float((peer["weights"] - w).abs().max()) <= 4 * torch.finfo(torch.float32).eps * params["scale"]
    assert torch.equal(peer["weights"], data.lowprec["weights"])  # the peer is the oracle's fp32 route


def test_router_bias_changes_selection_but_not_weights():
    case = Case("router", rspace.case(512, 256, 1.5, False), 2)
    data = CaseData(get_family("router"), case, "cpu")
    scores = torch.nn.functional.softplus(data.inputs["logits"]).sqrt()
    unbiased_top = scores.topk(6, dim=-1).indices.sort(-1).values
    assert (unbiased_top != data.oracle["indices"].sort(-1).values).any(dim=-1).float().mean() > 0.2
    picked = scores.gather(-1, data.oracle["indices"])
    assert torch.allclose(data.oracle["weights"].float(), picked / picked.sum(-1, keepdim=True) * 1.5)
