"""The `deepgemm-kernels` layer peer on a GPU (marked `gpu`): our dispatch + DeepGEMM's grouped FP8 GEMMs +
the compiled activation + our combine, through the one evaluation path (poisoned outputs, canaries, the
tolerance rule), on a small masked and a small contiguous case (tests/moe/test_moe_peers_cpu.py's)."""

from __future__ import annotations

import pytest

from dsv4bench.core.registry import get_impl
from tests.moe.test_moe_peers_cpu import CASES

pytestmark = pytest.mark.gpu

SMALL = [CASES[1], CASES[3]]  # masked (hash: a token on one expert twice), contiguous (sparse: empty experts)


@pytest.mark.parametrize("case", SMALL, ids=[c.id for c in SMALL])
def test_peer_passes_the_rule(case, gpu_check):
    peer = get_impl("moe", "deepgemm-kernels")
    if peer.available():
        pytest.skip(peer.available())
    gpu_check(case, peer)


@pytest.mark.parametrize("counts", [None, (0, 37, 128, 5)], ids=["contiguous", "masked"])
def test_triton_activation_is_swiglu_then_the_fp8_rule(counts):
    """peer_activation.swiglu_quant_into against `peers.swiglu_quant` (torch) on fresh inputs: every written code
    within one e4m3 step of torch's (silu's exp is Triton's), >= 99% equal, scales equal; contiguous padding rows
    zero, masked rows past min(count, used) untouched."""
    import torch

    from kernels.moe.peer_activation import swiglu_quant_into
    from kernels.moe.peers import swiglu_quant

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pytest.importorskip("triton")
    dev, i, m, used = "cuda", 384, 128, 96
    e = 1 if counts is None else len(counts)
    rows = e * m
    gate_up = (torch.randn(rows, 2 * i, device=dev) * 6).bfloat16()
    row_w = torch.rand(rows, device=dev)
    src = torch.randint(-1, 9, (rows,), device=dev, dtype=torch.int32)
    h = torch.full((rows, i), 0xAB, dtype=torch.uint8, device=dev)
    shape = (i // 128, rows) if counts is None else (e, i // 128, m)
    h_s = torch.full(shape, -1.0, device=dev)
    cnt = None if counts is None else torch.tensor(counts, dtype=torch.int32, device=dev)
    if cnt is None:
        gate_up[src < 0] = float("nan")  # padding rows DeepGEMM left as it found them
    else:  # a masked layout's counted rows are all real; the rest DeepGEMM left as it found them
        src.clamp_(min=0)
        gate_up[(torch.arange(m, device=dev) >= cnt.view(e, 1).clamp(max=used)).reshape(-1)] = float("nan")
    swiglu_quant_into(gate_up, row_w, src, h, h_s, cnt, None if cnt is None else used)
    want_q, want_s = swiglu_quant(gate_up.nan_to_num(), row_w, src, e, None if cnt is None else m)
    if cnt is None:
        live = torch.ones(rows, dtype=torch.bool, device=dev)
        got_s, want_s = h_s.t(), want_s.t()
    else:
        live = (torch.arange(m, device=dev) < cnt.view(e, 1).clamp(max=used)).reshape(-1)
        got_s, want_s = h_s.transpose(1, 2).reshape(rows, -1), want_s.transpose(1, 2).reshape(rows, -1)
        assert (h[~live] == 0xAB).all() and (got_s[~live] == -1).all()
    assert torch.equal(got_s[live], want_s[live])
    step = (h[live].int() - want_q.view(torch.uint8)[live].int()).abs()
    assert int(step.max()) <= 1 and float((step > 0).float().mean()) < 0.01, (int(step.max()), float((step > 0).float().mean()))
    if cnt is None:
        assert not h[src < 0].any()
