import torch
from hypothesis import given, settings, strategies as st

from oracles.hadamard import hadamard_matrix, hadamard_rotate, hadamard_rotate_lowprec
from oracles.linear import QuantWeight, dequant, linear, linear_lowprec
from oracles.quant import (fp8_qdq, quant_fp4_weight, quant_fp8_weight, quant_nvfp4_weight,
                           ue8m0_decode)

SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**31 - 1)


@settings(max_examples=8, deadline=None)
@given(log_n=st.integers(0, 8))
def test_hadamard_is_symmetric_orthonormal_and_sylvester(log_n):
    n = 2**log_n
    h = hadamard_matrix(n, torch.float64)
    torch.testing.assert_close(h @ h.T / n, torch.eye(n, dtype=torch.float64), rtol=0, atol=0)
    assert torch.equal(h, h.T)
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    popcount = torch.zeros_like(i)
    for bit in range(log_n):
        popcount += ((i & j) >> bit) & 1
    assert torch.equal(h, (1 - 2 * (popcount % 2)).double())


@SETTINGS
@given(seed=seeds)
def test_rotation_preserves_dot_products_and_is_an_involution(seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 5, 128, generator=g, dtype=torch.float64)
    rq, rk = hadamard_rotate(q, torch.float64), hadamard_rotate(k, torch.float64)
    torch.testing.assert_close((rq * rk).sum(-1), (q * k).sum(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hadamard_rotate(rq, torch.float64), q, rtol=1e-12, atol=1e-12)
    # an independent fast Walsh–Hadamard butterfly gives the same rotation
    y = q.clone()
    h = 1
    while h < 128:
        y = y.unflatten(-1, (-1, 2, h))
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), -2).flatten(-3)
        h *= 2
    torch.testing.assert_close(y / 128**0.5, rq, rtol=1e-12, atol=1e-12)
    xb = q.bfloat16()
    assert torch.equal(hadamard_rotate_lowprec(xb), hadamard_rotate(xb).bfloat16())


def _weight(seed, out_f, in_f):
    return torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed)) * 0.05


@SETTINGS
@given(seed=seeds, fmt=st.sampled_from(["fp8", "mxfp4", "nvfp4"]))
def test_oracle_linear_is_x_times_dequantised_weight(seed, fmt):
    g = torch.Generator().manual_seed(seed + 1)
    w = _weight(seed, 136, 256)
    x = torch.randn(3, 256, generator=g).bfloat16()
    qw = {"fp8": lambda: QuantWeight(*quant_fp8_weight(w)), "mxfp4": lambda: QuantWeight(*quant_fp4_weight(w)),
          "nvfp4": lambda: QuantWeight(*quant_nvfp4_weight(w))}[fmt]()
    assert qw.format == fmt
    wd = dequant(qw)
    torch.testing.assert_close(wd, w, rtol=0.3, atol=0.02)  # the codes really encode w
    o, i = torch.randint(0, 136, (), generator=g).item(), torch.randint(0, 256, (), generator=g).item()
    if fmt == "fp8":
        assert wd[o, i] == qw.weight[o, i].float() * ue8m0_decode(qw.scale)[o // 128, i // 128]
    expected = x.double() @ wd.double().T
    torch.testing.assert_close(linear(x, qw).double(), expected, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(seed=seeds, fmt=st.sampled_from(["fp8", "mxfp4"]))
def test_lowprec_linear_quantises_activations_per_128_and_outputs_bf16(seed, fmt):
    g = torch.Generator().manual_seed(seed + 2)
    w = _weight(seed, 64, 384)
    x = torch.randn(4, 384, generator=g).bfloat16() * 3
    qw = QuantWeight(*(quant_fp8_weight(w) if fmt == "fp8" else quant_fp4_weight(w)))
    y = linear_lowprec(x, qw)
    assert y.dtype == torch.bfloat16
    expected = fp8_qdq(x, 128).double() @ dequant(qw).double().T
    torch.testing.assert_close(y.double(), expected, rtol=2**-8, atol=1e-4)
    # the quantisation noise is real but small relative to the output
    rel = (y.double() - linear(x, qw).double()).norm() / linear(x, qw).double().norm()
    assert 1e-4 < rel < 0.1


@SETTINGS
@given(seed=seeds)
def test_plain_weights_run_in_their_own_dtype(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 32, generator=g).bfloat16()
    x = torch.randn(2, 32, generator=g).bfloat16()
    assert torch.equal(linear_lowprec(x, w), torch.nn.functional.linear(x, w))
    assert linear_lowprec(x, w.float()).dtype == torch.float32
    torch.testing.assert_close(linear(x, w), x.float() @ w.float().T)
