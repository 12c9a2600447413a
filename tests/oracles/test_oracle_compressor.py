import torch
from hypothesis import given, settings, strategies as st

from oracles.compressor import (CompressorState, compress_prefill, compressor_project, num_entries, postprocess,
                                postprocess_lowprec, visible_entries)
from oracles.hadamard import hadamard_rotate
from oracles.norm import rmsnorm
from oracles.quant import e2m1_decode, fp8_block_quant, mxfp4_quant
from oracles.rope import COMPRESSED_ROPE, apply_rope, rope_freqs

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**31 - 1)
ratios = st.sampled_from([4, 128])
D_MODEL = 24


def _weights(g, m, d):
    coff = 2 if m == 4 else 1
    return (torch.randn(coff * d, D_MODEL, generator=g) * 0.3, torch.randn(coff * d, D_MODEL, generator=g) * 0.3,
            torch.randn(m, coff * d, generator=g))


def _inputs(seed, m, d, blocks):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, blocks * m + m // 2 + 1, D_MODEL, generator=g).bfloat16()
    return x, _weights(g, m, d)


def _pooled_by_formula(x, wkv, wgate, ape, m, s):
    """fp64, one entry, written from §5.3/§5.4 directly."""
    x64, kv_w, gate_w, ape64 = x.double(), wkv.double(), wgate.double(), ape.double()
    d = wkv.shape[0] // (2 if m == 4 else 1)
    kv, z = [], []
    for t in range(s * m, s * m + m):
        k_t, z_t = x64[:, t] @ kv_w.T, x64[:, t] @ gate_w.T + ape64[t % m]
        if m == 4:
            kv.append(k_t[:, d:]), z.append(z_t[:, d:])  # own block: second half
            if s > 0:
                tp = t - m  # previous block: first half
                kv.append(x64[:, tp] @ kv_w[:d].T), z.append(x64[:, tp] @ gate_w[:d].T + ape64[tp % m, :d])
        else:
            kv.append(k_t), z.append(z_t)
    kv, z = torch.stack(kv, 1), torch.stack(z, 1)
    return (torch.softmax(z, dim=1) * kv).sum(1)


@settings(max_examples=6, deadline=None)
@given(seed=seeds, m=ratios)
def test_prefill_entries_match_the_per_channel_softmax_formula(seed, m):
    d = 8
    x, (wkv, wgate, ape) = _inputs(seed, m, d, blocks=3)
    c = compress_prefill(x, wkv, wgate, ape)
    assert c.shape == (2, num_entries(x.shape[1], m), d) == (2, 3, d)
    for s in (0, 2):  # the first entry has no previous block
        torch.testing.assert_close(c[:, s].double(), _pooled_by_formula(x, wkv, wgate, ape, m, s), rtol=1e-5, atol=1e-5)


@SETTINGS
@given(seed=seeds, m=ratios, split=st.integers(0, 1000))
def test_incremental_decode_state_reproduces_prefill_exactly(seed, m, split):
    d = 8
    x, (wkv, wgate, ape) = _inputs(seed, m, d, blocks=3)
    seqlen = x.shape[1]
    prefill = compress_prefill(x, wkv, wgate, ape)
    kv, score = compressor_project(x, wkv, wgate, ape, torch.arange(seqlen))
    s1 = split % seqlen  # prefill s1 tokens, then decode one token at a time
    state = CompressorState.after_prefill(kv[:, :s1], score[:, :s1], m)
    emitted = {}
    for t in range(s1, seqlen):
        entry = state.push(kv[:, t], score[:, t], t)
        assert (entry is not None) == ((t + 1) % m == 0), "emission happens exactly at the block's last token"
        if entry is not None:
            emitted[t // m] = entry
    assert sorted(emitted) == list(range(num_entries(s1, m), num_entries(seqlen, m)))
    for s, entry in emitted.items():
        assert torch.equal(entry, prefill[:, s])


@SETTINGS
@given(seed=seeds, m=ratios, t=st.integers(0, 3 * 128))
def test_entries_are_causal_and_become_visible_at_the_block_end(seed, m, t):
    d = 8
    x, (wkv, wgate, ape) = _inputs(seed, m, d, blocks=3)
    t = t % x.shape[1]
    full = compress_prefill(x, wkv, wgate, ape)
    changed = x.clone()
    changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:].float()).bfloat16()
    after = compress_prefill(changed, wkv, wgate, ape)
    n_vis = visible_entries(t, m)
    assert n_vis == (t + 1) // m
    # everything a query at t may see depends only on tokens ≤ t
    assert torch.equal(after[:, :n_vis], full[:, :n_vis])
    if n_vis < full.shape[1] and t + 1 < x.shape[1]:
        assert not torch.equal(after[:, n_vis], full[:, n_vis]), "the next entry does read later tokens"
    # a shorter prefill emits the same entries (up to GEMM blocking of the projections)
    torch.testing.assert_close(compress_prefill(x[:, :t + 1], wkv, wgate, ape), full[:, :n_vis])


@SETTINGS
@given(seed=seeds, m=ratios)
def test_main_postprocess_norms_ropes_at_block_start_and_fp8_quantises_nope(seed, m):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(2, 3, 128, generator=g) * 2
    w = 1 + 0.1 * torch.randn(128, generator=g)
    ids = torch.arange(3).expand(2, 3)
    freqs = rope_freqs(COMPRESSED_ROPE)
    plain = postprocess(c, w, ids, m, freqs, qat=False)
    torch.testing.assert_close(apply_rope(plain, ids * m, freqs, inverse=True), rmsnorm(c, w), rtol=1e-5, atol=1e-5)
    out = postprocess(c, w, ids, m, freqs)
    assert torch.equal(out[..., 64:], plain[..., 64:])
    codes, scale = fp8_block_quant(plain[..., :64], 64)
    assert torch.equal(out[..., :64], codes.float() * scale)
    low = postprocess_lowprec(c, w, ids, m, freqs)
    assert low.dtype == torch.bfloat16
    assert (low.double() - out.double()).norm() / out.double().norm() < 0.05


@SETTINGS
@given(seed=seeds)
def test_indexer_postprocess_rotates_then_fp4_quantises(seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(2, 3, 128, generator=g)
    w = 1 + 0.1 * torch.randn(128, generator=g)
    ids = torch.arange(3).expand(2, 3)
    freqs = rope_freqs(COMPRESSED_ROPE)
    main_plain = postprocess(c, w, ids, 4, freqs, qat=False)
    rotated = postprocess(c, w, ids, 4, freqs, indexer=True, qat=False)
    torch.testing.assert_close(hadamard_rotate(rotated), main_plain, rtol=1e-5, atol=1e-5)  # H is an involution
    out = postprocess(c, w, ids, 4, freqs, indexer=True)
    codes, scale = mxfp4_quant(rotated)
    assert torch.equal(out, (e2m1_decode(codes).unflatten(-1, (4, 32)) * scale.unsqueeze(-1)).flatten(-2))
    low = postprocess_lowprec(c, w, ids, 4, freqs, indexer=True)
    assert low.dtype == torch.bfloat16 and (low.double() - out.double()).norm() / out.double().norm() < 0.2
