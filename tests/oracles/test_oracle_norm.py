import torch
from hypothesis import given, settings, strategies as st

from oracles.norm import rmsnorm, rmsnorm_lowprec

SETTINGS = settings(max_examples=25, deadline=None)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), dim=st.sampled_from([8, 64, 512]))
def test_rmsnorm_matches_fp64_formula(seed, rows, dim):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * 3
    w = torch.randn(dim, generator=g)
    x64 = x.double()
    expected = w.double() * x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) / dim + 1e-6)
    torch.testing.assert_close(rmsnorm(x, w).double(), expected, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.5, 1e3))
def test_weightless_rmsnorm_has_unit_rms_and_is_scale_invariant(seed, scale):
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(seed))
    y = rmsnorm(x)
    torch.testing.assert_close(y.square().mean(-1), torch.ones(3), rtol=1e-4, atol=0)
    torch.testing.assert_close(rmsnorm(x * scale), y, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_lowprec_is_oracle_rounded_to_input_dtype(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 256, generator=g).bfloat16()
    w = torch.randn(256, generator=g)
    y = rmsnorm_lowprec(x, w)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, rmsnorm(x, w).bfloat16())
