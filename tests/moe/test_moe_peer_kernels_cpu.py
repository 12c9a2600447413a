"""The `deepgemm-kernels` layer peer on the CPU (kernels/moe/peer_kernels.py): its registration and
supports(), the layout adaptation (our dispatch's buffers at DeepGEMM's masked rows per expert, handed to
DeepGEMM as views), and its whole call with our dispatch / combine kernels emulated by the oracles (their
call conventions; padding rows poisoned, as the GPU leaves them unwritten), DeepGEMM by
tests/moe/test_moe_peers_cpu.py's emulation and the Triton activation by `emulated_activation` (the torch
math it follows, with its buffer contract), judged by the harness rule. The GPU run (and the Triton
activation against the torch math) is tests/moe/test_moe_peer_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_impl, impls
from kernels.moe import peer_kernels
from kernels.moe.family import case_max_m
from kernels.moe.peers import DG_MASKED_ALIGN, LAYER_ONLY, dg_operand, dg_rows_per_expert, swiglu_quant
from oracles.moe import combine, dispatch_layout, gather_quant
from oracles.quant import fp8_block_quant
from sweeps import moe as space
from tests.moe.test_moe_peers_cpu import CASES, FAMILY, fake_deep_gemm  # noqa: F401 (a fixture)

PEER = "deepgemm-kernels"


def test_registered_next_to_deepgemm_with_its_cases():
    peer = get_impl("moe", PEER)
    assert peer.name in {i.name for i in impls("moe")} and not peer.compiles and not peer.variant
    dg = get_impl("moe", "deepgemm")
    cases = [Case("moe", space.case(op, model, t, load)) for op in space.OPS for model in space.MODELS
             for t, load in ((1, "uniform"), (64, "hot"), (4096, "zipf"))] + CASES
    for case in cases:
        assert peer.supports(case, "sm_90a") == dg.supports(case, "sm_90a")
        assert peer.supports(case, None) == dg.supports(case, None) == peer.supports(case, "any")
    assert peer.supports(CASES[0], "sm_90a") is None and peer.supports(CASES[2], "sm_90a") is None
    assert peer.supports(Case("moe", space.case("dispatch", "flash", 1, "uniform")), "sm_90a") == LAYER_ONLY
    assert peer.supports(CASES[0], "sm_100a") == peer_kernels.SM90_ONLY
    odd = Case("moe", {**CASES[0].params, "i": 192})
    assert "multiples of 128" in peer.supports(odd, "sm_90a")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_dispatch_layout_is_deepgemms_without_a_copy(case):
    """Masked: m = the case's max_m rounded up to 128 rows an expert (DeepGEMM's BLOCK_M) holds every
    count; the dispatch layout at m (the oracle of our dispatch's buffers) becomes DeepGEMM's A as views
    of the same storage, scales MN-major. Contiguous: the rows and scales as they are."""
    e, m = case["e"], dg_rows_per_expert(case)
    data = CaseData(FAMILY, case, "cpu")
    if case["layout"] == "masked":
        assert m % DG_MASKED_ALIGN == 0 and case_max_m(case) <= m < case_max_m(case) + DG_MASKED_ALIGN
        rows = e * m
    else:
        assert m is None
        rows = 4096
    lay = dispatch_layout(data.inputs["idx"], data.inputs["weights"], e, rows, m)
    assert m is None or int(lay["counts"].max()) <= m
    codes, scales = gather_quant(data.inputs["x"], lay["src"], 1 if m is None else e)
    a, sa = dg_operand(codes, scales, e, m)
    assert a.data_ptr() == codes.data_ptr() and sa.data_ptr() == scales.data_ptr()
    d = case["d"]
    want = ((rows, d), (rows, d // 128)) if m is None else ((e, m, d), (e, m, d // 128))
    assert (tuple(a.shape), tuple(sa.shape)) == want and a.dtype == torch.float8_e4m3fn
    assert sa.stride(-2) == 1  # MN-major: DeepGEMM takes it without a transposed copy
    ref_q, ref_s = fp8_block_quant(data.inputs["x"][lay["src"][0].long()], 128)
    assert torch.equal(a.reshape(rows, d)[0].view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(sa.reshape(rows, -1)[0] if m is None else sa[0, 0], ref_s)


def emulated_activation(gate_up, row_weight, src, h, h_scales, counts=None, used=None):
    """peer_activation.swiglu_quant_into's contract in torch (`peers.swiglu_quant`'s math): contiguous, every
    row (padding rows zero); masked, only each expert's first min(count, used) rows of m are written."""
    rows = gate_up.shape[0]
    e = 1 if counts is None else counts.numel()
    m = rows // e
    codes, scales = swiglu_quant(gate_up, row_weight, src, e, None if counts is None else m)
    if counts is None:
        h.copy_(codes.view(torch.uint8))
        h_scales.copy_(scales)
        return
    live = (torch.arange(m) < counts.view(e, 1).clamp(max=used)).reshape(-1)
    h[live] = codes.view(torch.uint8)[live]
    h_scales.copy_(torch.where(live.view(e, 1, m), scales, h_scales))


def _emulated_kernels(layout: str):
    """Our dispatch and combine as the oracles compute them, with the compiled kernels' arguments."""
    def dispatch(x, idx, w, counts, pos, src, expert, row_w, codes, scales):
        t = x.shape[0]
        e, rows = counts.numel(), src.numel()
        m = rows // e if layout == "masked" else None
        lay = dispatch_layout(idx.view(t, -1), w.view(t, -1), e, rows, m)
        q, s = gather_quant(x, lay["src"], 1 if m is None else e)
        for buf, v in ((counts, lay["counts"]), (pos, lay["pos"].view(-1)), (src, lay["src"]),
                       (expert, lay["expert"]), (row_w, lay["row_weight"]), (codes, q), (scales, s.view(scales.shape))):
            buf.copy_(v)
        if m is not None:  # skip_padding: the GPU leaves the padding rows as they were
            pad = lay["src"] < 0
            codes[pad] = 0x7F  # e4m3 NaN
            scales.view(e, -1, m).masked_fill_(pad.view(e, 1, m), float("nan"))

    def comb(rows, pos, shared, y):
        y.copy_(combine(rows, pos, shared).bfloat16())

    return dispatch, comb


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_peer_passes_the_rule_with_emulated_kernels(case, fake_deep_gemm, monkeypatch):  # noqa: F811
    monkeypatch.setattr(peer_kernels, "our_kernels", lambda e, k, d, layout, arch="sm_90a": _emulated_kernels(layout))
    monkeypatch.setattr(peer_kernels.peer_activation, "swiglu_quant_into", emulated_activation)
    data = CaseData(FAMILY, case, "cpu")
    x = data.inputs["x"]
    p = peer_kernels.plan(x.shape[0], case["k"], case["e"], case["d"], case["i"], dg_rows_per_expert(case), x.device)
    p["d1"].fill_(float("nan"))  # DeepGEMM's contiguous kernel skips padding blocks: they keep this
    p["d2"].fill_(float("nan"))
    out = get_impl("moe", PEER).run(case, data.inputs, FAMILY.alloc_outputs(case, "cpu"), None)
    ok, metrics = compare_outputs(out, data.oracle, data.lowprec, lambda n: FAMILY.tolerance_for(case, n))
    assert ok, {k: m.summary() for k, m in metrics.items()}
