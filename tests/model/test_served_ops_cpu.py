"""The ops served beyond the projections (kernels/gemm/serves.py indexer_queries and mtp_input,
kernels/compressor/serves.py, kernels/sampler/serves.py) on the CPU, each kernel emulated by its
family's torch reference (tests/gemm/test_serves_cpu.py `emulated`): the adapters' structure against
the FP32 oracle by the FP8 rule (sample: the same tokens), a wrong adapter failing it, and what they
refuse. The kernels themselves: test_served_ops_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.core.registry import Unsupported, get_family
from dsv4bench.model.dispatch import OPS, ORACLE_ONLY
from kernels.compressor import serves as compressor
from kernels.gemm import serves as gemm
from kernels.sampler import serves as sampler
from tests.gemm.test_serves_cpu import emulated
from tests.model import served_args as sa


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setattr(gemm, "kernel_runner", emulated)
    return emulated


def test_the_families_serve_these_ops_and_they_are_off_the_oracle_only_list():
    for family, ops in (("gemm", {"indexer_queries", "mtp_input"}), ("compressor", {"compressor_prefill"}),
                        ("sampler", {"sample"})):
        assert ops <= set(get_family(family).serves) and not ops & set(ORACLE_ONLY), family


@pytest.mark.parametrize("tokens", [1, 7, 130])
def test_indexer_queries(tokens, kernels, monkeypatch):
    args, kwargs = sa.op_args("indexer_queries", sa.SMALL, tokens, seed=random.randrange(1 << 30), device="cpu")
    out = gemm.indexer_queries(kernels("gemm"), *args, **kwargs)
    assert out.shape == (tokens, sa.SMALL.index_heads, sa.INDEX_HEAD_DIM) and out.dtype == torch.float32
    sa.assert_passes("indexer_queries", out, args, kwargs, monkeypatch)


def test_indexer_queries_at_the_wrong_positions_fail_the_rule(kernels, monkeypatch):
    args, kwargs = sa.op_args("indexer_queries", sa.SMALL, 64, seed=random.randrange(1 << 30), device="cpu")
    shifted = (*args[:3], args[3] + 1, args[4])
    with pytest.raises(AssertionError):
        sa.assert_passes("indexer_queries", gemm.indexer_queries(kernels("gemm"), *shifted, **kwargs), args, kwargs,
                         monkeypatch)


def test_indexer_queries_without_qat_is_unsupported(kernels):
    args, _ = sa.op_args("indexer_queries", sa.SMALL, 3, seed=1, device="cpu")
    with pytest.raises(Unsupported, match="MXFP4"):
        gemm.indexer_queries(kernels("gemm"), *args, qat=False)


@pytest.mark.parametrize("tokens", [1, 33])
def test_mtp_input(tokens, kernels, monkeypatch):
    args, kwargs = sa.op_args("mtp_input", sa.SMALL, tokens, seed=random.randrange(1 << 30), device="cpu")
    out = gemm.mtp_input(kernels("gemm"), *args, **kwargs)
    assert out.shape == args[0].shape and out.dtype == torch.float32
    sa.assert_passes("mtp_input", out, args, kwargs, monkeypatch)
    swapped = (*args[:5], args[6], args[5])  # e_proj and h_proj exchanged
    with pytest.raises(AssertionError):
        sa.assert_passes("mtp_input", gemm.mtp_input(kernels("gemm"), *swapped, **kwargs), args, kwargs, monkeypatch)


@pytest.mark.parametrize("ratio,tokens,batch", [(4, 4 * 37 + 3, 2), (4, 4, 1), (128, 128 * 3 + 77, 2), (128, 31, 1),
                                                (4, 3, 2)])
def test_compressor_prefill(ratio, tokens, batch, monkeypatch):
    args, kwargs = sa.op_args("compressor_prefill", sa.SMALL, tokens, seed=random.randrange(1 << 30), device="cpu",
                              batch=batch, ratio=ratio)
    out = compressor.compressor_prefill(emulated("compressor"), *args, **kwargs)
    assert out.shape == (batch, tokens // ratio, sa.ENTRY) and out.dtype == torch.float32
    if tokens >= ratio:  # shorter than one block: no entries and no launch (the kernel takes one block or more)
        sa.assert_passes("compressor_prefill", out, args, kwargs, monkeypatch)
    assert OPS["compressor_prefill"].oracle(*args, **kwargs).shape == out.shape


def _compressor_kernel(params, inputs):
    """The compressor kernel's math on the CPU (kernels/compressor/compressor.py): fp32 pooling and norm,
    RoPE by the table row of position s·m, FP8 qdq of the NoPE dims, one cast to bf16."""
    from kernels.compressor.family import split
    from oracles.compressor import block_candidates, pool
    from oracles.norm import rmsnorm
    from oracles.projections import nope_fp8_qdq

    m = params["m"]
    c = rmsnorm(pool(*block_candidates(inputs["kv"], inputs["score"], m)), inputs["norm_w"].float())
    rows = inputs["table"][torch.arange(c.shape[1]) * m].view(-1, sa.ROPE_PAIRS, 2)  # (cos, sin) pairs
    pairs = torch.view_as_complex(c[..., -2 * sa.ROPE_PAIRS:].reshape(*c.shape[:-1], sa.ROPE_PAIRS, 2).contiguous())
    rotated = torch.view_as_real(pairs * torch.view_as_complex(rows.contiguous())).flatten(-2)
    return split(nope_fp8_qdq(torch.cat((c[..., :-2 * sa.ROPE_PAIRS], rotated), -1)).bfloat16())


@pytest.mark.parametrize("ratio,tokens,batch", [(4, 4 * 37 + 3, 2), (128, 128 * 3 + 77, 2)])
def test_compressor_prefill_reads_the_table_rows_of_its_entries(ratio, tokens, batch):
    """With the kernel's own math emulated (table rows included), the adapter gives the oracle's NoPE
    codes exactly and its RoPE dims to one bf16 rounding: the table covers every entry's s·m."""
    args, kwargs = sa.op_args("compressor_prefill", sa.SMALL, tokens, seed=random.randrange(1 << 30), device="cpu",
                              batch=batch, ratio=ratio)
    out = compressor.compressor_prefill(_compressor_kernel, *args, **kwargs)
    want = OPS["compressor_prefill"].oracle(*args, **kwargs)
    nope = -2 * sa.ROPE_PAIRS
    assert torch.equal(out[..., :nope], want[..., :nope])
    torch.testing.assert_close(out[..., nope:], want[..., nope:], rtol=2**-8, atol=0)


def test_what_the_compressor_kernel_does_not_take_is_unsupported():
    args, kwargs = sa.op_args("compressor_prefill", sa.SMALL, 8, seed=1, device="cpu")
    run = emulated("compressor")
    for change, why in (({"indexer": True}, "Hadamard"), ({"qat": False}, "QAT on"), ({"eps": 1e-5}, "eps")):
        with pytest.raises(Unsupported, match=why):
            compressor.compressor_prefill(run, *args, **dict(kwargs, **change))


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("rows", [1, 3])
def test_sample_gives_the_oracles_tokens(temperature, rows):
    logits = sa.sample_args(rows, 1000, seed=random.randrange(1 << 30), device="cpu")
    seed = random.randrange(1 << 30)
    got = sampler.sample(emulated("sampler"), logits, temperature, torch.Generator().manual_seed(seed))
    want = OPS["sample"].oracle(logits, temperature, torch.Generator().manual_seed(seed))
    assert got.shape == want.shape and torch.equal(got, want)
    if temperature and rows == 3:  # the noise decides: another seed draws other tokens somewhere
        others = [sampler.sample(emulated("sampler"), logits, temperature, torch.Generator().manual_seed(seed + k))
                  for k in range(1, 4)]
        assert any(not torch.equal(o, got) for o in others)


class _LogitsKernels:
    """The logits kernels' contracts on the CPU (the fp32 truth of their FP8-cache operands), keeping
    the shape of each call: the prefill kernel's [T, S_kv] or the paged decode kernel's [B, W]."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, inputs):
        from kernels.indexer.decode_glue import check_decode, decode_reference
        from kernels.indexer.glue import check_operands, oracle_of

        self.calls.append(params)
        if params.get("op") == "decode":
            check_decode(**inputs, out=torch.empty(params["t"], params["s_kv"]))
            return {"logits": decode_reference(**inputs, width=params["s_kv"])}
        check_operands(**inputs)  # the launch's own refusals (TMA alignment of every sequence's scales)
        return {"logits": oracle_of(**inputs)}


def _logits_kernel(params, inputs):
    return _LogitsKernels()(params, inputs)


@pytest.mark.parametrize("batch,seqlen,n,start", [(1, 37, 9, 0), (2, 1, 40, 157), (3, 5, 12, 43), (1, 1, 64, 300),
                                                  (4, 1, 130, 515), (3, 1, 7, 5), (2, 3, 75, 300)])
def test_indexer_scores_on_fp4_operands_are_the_oracles(batch, seqlen, n, start):
    """A decode step (one token a sequence) is one paged launch of [B, N]; a prefill one launch a
    sequence of [S, N]: never the B·S x B·N output of all sequences against all keys."""
    from kernels.indexer import serves as indexer

    q, k, w = sa.indexer_operands(batch, seqlen, n, random.randrange(1 << 30), "cpu")
    positions = torch.arange(start, start + seqlen)
    kernels = _LogitsKernels()
    got = indexer.indexer_scores(kernels, q, k, w, positions)
    want = OPS["indexer_scores"].oracle(q, k, w, positions)
    assert got.shape == want.shape and torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if seqlen == 1:
        assert kernels.calls == [{"op": "decode", "t": batch, "s_kv": n, "mask": "ragged"}]
    else:
        assert kernels.calls == [{"mask": "varlen", "t": seqlen, "s_kv": n}] * batch
    if batch > 1:  # each sequence scored against its own keys
        swapped = indexer.indexer_scores(_LogitsKernels(), q, k.flip(0), w, positions)
        assert not torch.allclose(swapped.nan_to_num(neginf=0), want.nan_to_num(neginf=0))


def test_indexer_scores_at_decode_take_each_sequences_own_position():
    """A batch whose sequences stand at different positions ([B, 1] positions): each row sees its own
    ⌊(t+1)/4⌋ entries, some none, some all."""
    from kernels.indexer import serves as indexer

    q, k, w = sa.indexer_operands(4, 1, 70, random.randrange(1 << 30), "cpu")
    positions = torch.tensor([[2], [3], [150], [400]])
    got = indexer.indexer_scores(_logits_kernel, q, k, w, positions)
    want = OPS["indexer_scores"].oracle(q, k, w, positions)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and bool(torch.isinf(got[0]).all())
    assert int(torch.isfinite(got[1]).sum()) == 1 and bool(torch.isfinite(got[3]).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_indexer_scores_refuse_what_e4m3_would_round():
    from kernels.indexer import serves as indexer

    q, k, w = sa.indexer_operands(1, 4, 8, random.randrange(1 << 30), "cpu")
    positions = torch.arange(40, 44)
    for args, why in (((torch.randn_like(q), k), "queries"), ((q, torch.randn_like(k)), "keys"),
                      ((q[:, :, :16], k), "64 heads")):
        with pytest.raises(Unsupported, match=why):
            indexer.indexer_scores(_logits_kernel, *args, w[..., :args[0].shape[2]], positions)
