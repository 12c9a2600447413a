"""The model's `sparse_attention` on the fmha kernel (kernels/fmha/serves.py): the case and inputs the
adapter builds are the kernel's contract for the model's shapes, and through the family's bf16
reference (the kernel's own low-precision math, emulated on the CPU) they give the FP32 oracle's answer
within bf16 rounding; on the GPU the kernel itself against the oracle, with fresh index lists each call
(the kernel's index cache must not serve a previous call's)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Unsupported, get_impl
from dsv4bench.model.config import FLASH, PRO, TINY
from kernels.fmha.family import FAMILY
from kernels.fmha.serves import case_params, sparse_attention
from oracles.fmha import sparse_attention as oracle


def _call(s_q=37, h=8, d=64, s_kv=300, n=140, sink=True, gen=None, device="cpu"):
    g = gen or torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    q = torch.randn(s_q, h, d, generator=g)
    kv = torch.randn(s_kv, d, generator=g)
    idx = torch.randint(-1, s_kv + 3, (s_q, n), generator=g)  # -1 and out-of-range entries: no key
    if s_q > 1:
        idx[0] = -1  # a row with no key at all (its output is 0)
    return [t.to(device) for t in (q, kv, idx)] + [torch.randn(h, generator=g).to(device) if sink else None, d ** -0.5]


def _emulated(params, inputs):
    return FAMILY.lowprec(Case("fmha", params), inputs)


@pytest.mark.parametrize("sink", [True, False])
def test_adapter_reproduces_the_oracle_through_the_kernels_reference(sink):
    q, kv, idx, sk, scale = _call(sink=sink)
    out, lse = sparse_attention(_emulated, q, kv, idx, sk, scale)
    ref, ref_lse = oracle(q, kv, idx, sk, scale)
    assert out.dtype == torch.float32 and out.shape == ref.shape and lse.shape == ref_lse.shape
    assert float((out - ref).norm() / ref.norm()) < 1e-2


def test_the_model_shapes_are_in_the_kernels_contract():
    impl = get_impl("fmha", "cutedsl")
    for cfg in (TINY, FLASH, PRO):
        for n in (cfg.window_size, cfg.window_size + cfg.index_topk, cfg.window_size + 37):
            case = Case("fmha", case_params(5, cfg.n_heads, cfg.head_dim, 700, n, True))
            assert impl.supports(case, "sm_90a") is None, (cfg.name, n, impl.supports(case, "sm_90a"))


def test_refuses_what_the_kernel_does_not_compute():
    q, kv, idx, sk, scale = _call()
    with pytest.raises(Unsupported, match="scale"):
        sparse_attention(_emulated, q, kv, idx, sk, 0.5)
    with pytest.raises(Unsupported, match="separate values"):
        sparse_attention(_emulated, q, kv, idx, sk, scale, v=kv)


@pytest.mark.gpu
def test_the_kernel_serves_the_op_with_fresh_indices_every_call():
    from dsv4bench.model.kernel_ops import served_ops

    op = served_ops()["sparse_attention"]
    g = torch.Generator().manual_seed(7)
    for s_q, n in ((37, 140), (37, 140), (1, 640), (300, 128)):  # the same shapes twice: new index lists
        q, kv, idx, sk, scale = _call(s_q=s_q, h=64, d=512, s_kv=900, n=n, gen=g, device="cuda")
        out, lse = op(q, kv, idx, sk, scale)
        ref, _ = oracle(q.cpu(), kv.cpu(), idx.cpu(), sk.cpu(), scale)
        rel = float((out.cpu() - ref).norm() / ref.norm())
        assert rel < 1e-2, (s_q, n, rel)
