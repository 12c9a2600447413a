"""The moe family's layer peers on the CPU: the eager loop and torch._grouped_mm run here (torch 2.13 has
a CPU _grouped_mm), and the DeepGEMM peer's glue (layouts, scale layouts, the SwiGLU, the combine) runs
against a torch emulation of DeepGEMM's two grouped calls, so a GPU run tests DeepGEMM and not our glue.
Each is judged by the harness rule against the FP32 oracle."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family, get_impl
from sweeps import moe as space

FAMILY = get_family("moe")
CASES = [Case("moe", {**space.case("layer", "drawn", t, load, e=e, d=256, i=384), "layout": layout})
         for t, load, e, layout in ((1, "uniform", 8, "masked"), (37, "hash", 5, "masked"),
                                    (200, "hot", 7, "contiguous"), (130, "sparse", 16, "contiguous"))]


def _dequant(codes, scales):
    """e4m3 [.., R, K] x fp32 scales [.., R, K/128] (any strides) -> fp32."""
    return codes.float() * scales.float().repeat_interleave(128, -1)


def _weights(w, sw):
    return _dequant(w, sw.repeat_interleave(128, -2)[..., : w.shape[-2], :])


def _contiguous(a, b, d, m_indices):
    x, w = _dequant(*a), _weights(*b)
    for r in torch.nonzero(m_indices >= 0).flatten().tolist():
        d[r] = (x[r] @ w[m_indices[r]].t()).bfloat16()


def _masked(a, b, d, masked_m, expected_m):
    assert expected_m > 0
    x, w = _dequant(*a), _weights(*b)
    for g, m in enumerate(masked_m.tolist()):
        d[g, :m] = (x[g, :m] @ w[g].t()).bfloat16()


@pytest.fixture
def fake_deep_gemm(monkeypatch):
    mod = types.SimpleNamespace(m_grouped_fp8_gemm_nt_contiguous=_contiguous, m_grouped_fp8_gemm_nt_masked=_masked,
                                get_mk_alignment_for_contiguous_layout=lambda: 128)
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)


@pytest.mark.parametrize("impl", ["torch", "torch_grouped_mm", "deepgemm"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layer_peer_passes_the_rule(case, impl, fake_deep_gemm):
    data = CaseData(FAMILY, case, "cpu")
    out = get_impl("moe", impl).run(case, data.inputs, FAMILY.alloc_outputs(case, "cpu"), None)
    ok, metrics = compare_outputs(out, data.oracle, data.lowprec, lambda n: FAMILY.tolerance_for(case, n))
    assert ok, {k: m.summary() for k, m in metrics.items()}


def test_dispatch_and_combine_torch_peer_is_the_reference():
    for op in ("dispatch", "combine"):
        case = Case("moe", space.case(op, "drawn", 50, "zipf", e=9, d=384, i=128))
        data = CaseData(FAMILY, case, "cpu")
        out = get_impl("moe", "torch").run(case, data.inputs, {}, None)
        assert compare_outputs(out, data.oracle, data.lowprec, lambda n: FAMILY.tolerance_for(case, n))[0]
