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


DG_BLOCK_M = 128  # the largest of DeepGEMM's SM90 masked BLOCK_M candidates {64, 128}


def _masked(a, b, d, masked_m, expected_m):
    """DeepGEMM 2.6.1 `m_grouped_fp8_gemm_nt_masked` on SM90 with fp32 scales: its host checks
    (csrc/apis/gemm.hpp, csrc/utils/layout.hpp check_sf_layout) and its kernel's row blocks: the scheduler
    runs ceil(masked_m[g] / BLOCK_M) blocks of group g, each reading A and TMA-storing BLOCK_M whole rows
    of D viewed as [G * max_m, N] at g * max_m + block * BLOCK_M (clipped only at the tensor's end). The
    groups run in any order; here the last first, so a block that spills into the next group's rows
    overwrites that group's result, as it may on the GPU."""
    (xa, sa), (wb, sb) = a, b
    assert isinstance(expected_m, int) and expected_m > 0
    assert masked_m.dtype == torch.int32 and masked_m.is_contiguous() and masked_m.dim() == 1
    assert xa.dtype == wb.dtype == torch.float8_e4m3fn and d.dtype == torch.bfloat16
    g_, m_, k_ = xa.shape
    g_b, n_, k_b = wb.shape
    assert (g_b, k_b) == (g_, k_) and tuple(d.shape) == (g_, m_, n_) and masked_m.numel() == g_
    for t in (xa, wb, d):  # K-major A, B; N-major D; groups packed (utils/layout.hpp major_check)
        assert t.stride(-1) == 1 and t.stride(0) == t.shape[1] * t.shape[2]
    assert sa.dtype == torch.float32 and tuple(sa.shape) == (g_, m_, k_ // 128)  # per-token, recipe (1, 128, 128)
    assert sa.stride(-1) == 1 or sa.stride(-2) == 1
    assert sb.dtype == torch.float32 and tuple(sb.shape) == (g_, -(-n_ // 128), k_ // 128)
    assert sb.stride(0) == sb.shape[1] * sb.shape[2] and (sb.stride(-1) == 1 or sb.stride(-2) == 1)
    assert int(masked_m.max()) <= m_, "masked_m past max_m"
    x, w = _dequant(xa, sa).view(g_ * m_, k_), _weights(wb, sb)
    flat = d.view(g_ * m_, n_)
    for g in reversed(range(g_)):
        for blk in range(-(-int(masked_m[g]) // DG_BLOCK_M)):
            r0 = g * m_ + blk * DG_BLOCK_M
            flat[r0: r0 + DG_BLOCK_M] = (x[r0: r0 + DG_BLOCK_M] @ w[g].t()).bfloat16()


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


def test_deepgemm_masked_rows_per_expert_are_whole_blocks(fake_deep_gemm, monkeypatch):
    """The masked layout handed to DeepGEMM has max_m a multiple of its BLOCK_M (a case's own max_m is a
    multiple of 16 only), and the emulation above catches a layout that is not."""
    case = CASES[0]
    seen = []
    monkeypatch.setattr(sys.modules["deep_gemm"], "m_grouped_fp8_gemm_nt_masked",
                        lambda a, b, d, masked_m, expected_m: (seen.append(d.shape[1]), _masked(a, b, d, masked_m,
                                                                                               expected_m)))
    data = CaseData(FAMILY, case, "cpu")
    get_impl("moe", "deepgemm").run(case, data.inputs, FAMILY.alloc_outputs(case, "cpu"), None)
    assert len(seen) == 2 and all(m % DG_BLOCK_M == 0 for m in seen), seen
    # a 16-row group: the first group's 128-row block overwrites the next groups' rows
    e, m, k, n = 3, 16, 128, 128
    x = torch.ones(e, m, k).to(torch.float8_e4m3fn)
    sa = torch.ones(e, m, 1)
    w = torch.stack([torch.full((n, k), float(g + 1)) for g in range(e)]).to(torch.float8_e4m3fn)
    d = torch.zeros(e, m, n, dtype=torch.bfloat16)
    _masked((x, sa), (w, torch.ones(e, 1, 1)), d, torch.full((e,), 1, dtype=torch.int32), 1)
    assert float(d[1, 0, 0]) != 2 * k


def test_dispatch_and_combine_torch_peer_is_the_reference():
    for op in ("dispatch", "combine"):
        case = Case("moe", space.case(op, "drawn", 50, "zipf", e=9, d=384, i=128))
        data = CaseData(FAMILY, case, "cpu")
        out = get_impl("moe", "torch").run(case, data.inputs, {}, None)
        assert compare_outputs(out, data.oracle, data.lowprec, lambda n: FAMILY.tolerance_for(case, n))[0]
