import torch
from hypothesis import given, settings, strategies as st

from oracles.attention import (SOFTMAX_SCALE, apply_sink, attention, attention_core, attention_lowprec, decode_cache,
                               decode_key_indices, layer_key_indices, merge_segments, output_projection,
                               output_projection_lowprec)
from oracles.fmha import sparse_attention
from oracles.indexer import causal_entry_mask, indexer_topk
from oracles.rope import COMPRESSED_ROPE, SWA_ROPE, apply_rope, rope_freqs

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def _softmax_with_sink_fp64(q, keys, sink):
    """One softmax over the given keys plus a zero-value virtual key with logit sink (§7.2)."""
    logits = torch.einsum("hd,nd->hn", q.double(), keys.double()) * SOFTMAX_SCALE
    logits = torch.cat((logits, sink.double().unsqueeze(-1)), dim=-1)
    p = torch.softmax(logits, dim=-1)[:, :-1]
    return p @ keys.double()


@SETTINGS
@given(seed=seeds, n_win=st.integers(1, 16), n_comp=st.integers(0, 12), sink_shift=st.floats(-8, 8))
def test_sink_softmax_equals_lse_merge_and_flashmla_form(seed, n_win, n_comp, sink_shift):
    g = torch.Generator().manual_seed(seed)
    h = 3
    q = torch.randn(1, h, 512, generator=g)
    kv = torch.randn(n_win + n_comp, 512, generator=g)
    sink = torch.randn(h, generator=g) + sink_shift
    win_idx = torch.arange(n_win).unsqueeze(0)
    comp_idx = (n_win + torch.arange(n_comp)).unsqueeze(0) if n_comp else torch.full((1, 1), -1)  # -1 = no key
    all_idx = torch.cat((comp_idx, win_idx), dim=1)
    expected = _softmax_with_sink_fp64(q[0], kv, sink)

    with_sink, _ = sparse_attention(q, kv, all_idx, sink, SOFTMAX_SCALE)
    o_all, lse_all = sparse_attention(q, kv, all_idx, None, SOFTMAX_SCALE)
    o_win, lse_win = sparse_attention(q, kv, win_idx, None, SOFTMAX_SCALE)
    o_comp, lse_comp = sparse_attention(q, kv, comp_idx, None, SOFTMAX_SCALE)
    if n_comp == 0:
        assert torch.isneginf(lse_comp).all()
    merged = merge_segments([o_win, o_comp], [lse_win, lse_comp], sink)
    flashmla = apply_sink(o_all, lse_all, sink)
    for got in (with_sink, merged, flashmla):
        torch.testing.assert_close(got[0].double(), expected, rtol=1e-5, atol=1e-6)
    # without a sink the merge is the plain softmax over the union
    torch.testing.assert_close(merge_segments([o_win, o_comp], [lse_win, lse_comp]), o_all, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(seq=st.integers(1, 40), ratio=st.sampled_from([0, 4, 128]), window=st.sampled_from([8, 128]))
def test_prefill_key_sets_follow_the_window_and_causality_rules(seq, ratio, window):
    g = torch.Generator().manual_seed(seq)
    selected = None
    if ratio == 4:
        scores = torch.randn(seq, seq // 4, generator=g).masked_fill(~causal_entry_mask(torch.arange(seq), seq // 4),
                                                                     float("-inf"))
        selected = indexer_topk(scores, 3)
    idx = layer_key_indices(seq, ratio, selected, window)
    for t in range(seq):
        row = set(idx[t][idx[t] >= 0].tolist())
        win = set(range(max(0, t - window + 1), t + 1))
        comp = {seq + e for e in range(seq // ratio)} if ratio else set()
        assert win <= row and row - win <= comp
        picked = {r - seq for r in row - win}
        assert all(e < (t + 1) // ratio for e in picked)  # never an entry beyond floor((t+1)/m)
        if ratio == 128:
            assert picked == set(range((t + 1) // 128))
        if ratio == 4:
            assert picked == set(selected[t][selected[t] >= 0].tolist())


@SETTINGS
@given(seed=seeds, ratio=st.sampled_from([0, 4, 128]), t=st.integers(0, 300))
def test_decode_cache_encoding_gives_the_prefill_attention(seed, ratio, t):
    g = torch.Generator().manual_seed(seed)
    seq, h, window = 300, 2, 16
    t = t % seq
    n_entries = seq // ratio if ratio else 0
    raw = torch.randn(1, seq, 512, generator=g)
    comp = torch.randn(1, n_entries, 512, generator=g)
    q = torch.randn(1, seq, h, 512, generator=g)
    sink = torch.randn(h, generator=g)
    selected = None
    if ratio == 4:
        scores = torch.randn(seq, n_entries, generator=g).masked_fill(
            ~causal_entry_mask(torch.arange(seq), n_entries), float("-inf"))
        selected = indexer_topk(scores, 5)
    kv_all = torch.cat((raw, comp), dim=1)
    prefill_idx = layer_key_indices(seq, ratio, selected, window)
    o_prefill, _ = attention_core(q[:, t:t + 1], kv_all, prefill_idx[t:t + 1], sink)
    visible = comp[:, :(t + 1) // ratio] if ratio else None
    cache = decode_cache(raw, visible, t, window)
    idx = decode_key_indices(t, ratio, None if selected is None else selected[t], window)
    o_decode, _ = attention_core(q[:, t:t + 1], cache, idx.unsqueeze(0), sink)
    torch.testing.assert_close(o_decode, o_prefill, rtol=1e-5, atol=1e-6)


def _proj_weights(g, h, groups, rank, dim):
    return torch.randn(groups * rank, h // groups * 512, generator=g) * 0.03, torch.randn(dim, groups * rank, generator=g) * 0.1


@SETTINGS
@given(seed=seeds, groups=st.sampled_from([1, 2, 4]), cfg=st.sampled_from([SWA_ROPE, COMPRESSED_ROPE]))
def test_output_projection_unrotates_then_projects_each_head_group_separately(seed, groups, cfg):
    g = torch.Generator().manual_seed(seed)
    h, rank, dim = 4, 8, 16
    wo_a, wo_b = _proj_weights(g, h, groups, rank, dim)
    values = torch.randn(2, 3, h, 512, generator=g)
    pos = torch.randint(0, 50_000, (2, 3), generator=g)
    freqs = rope_freqs(cfg)
    o = apply_rope(values, pos.unsqueeze(-1), freqs)  # the rope part is a position-rotated mixture
    out = output_projection(o, pos, freqs, wo_a, wo_b, groups)
    # block-diagonal form: group g's heads only meet wo_a rows [g·r, (g+1)·r)
    block_diag = torch.zeros(groups * rank, h * 512, dtype=torch.float64)
    per = h // groups * 512
    for gi in range(groups):
        block_diag[gi * rank:(gi + 1) * rank, gi * per:(gi + 1) * per] = wo_a[gi * rank:(gi + 1) * rank].double()
    expected = values.double().flatten(-2) @ block_diag.T @ wo_b.double().T
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    low = output_projection_lowprec(o, pos, freqs, wo_a.bfloat16(), wo_b.bfloat16(), groups)
    assert low.dtype == torch.bfloat16 and (low.double() - out.double()).norm() / out.double().norm() < 2e-2


@SETTINGS
@given(seed=seeds)
def test_full_attention_lowprec_tracks_the_oracle(seed):
    g = torch.Generator().manual_seed(seed)
    seq, h, groups = 12, 4, 2
    kv = torch.randn(1, seq + 3, 512, generator=g).bfloat16()
    q = torch.randn(1, seq, h, 512, generator=g).bfloat16()
    sink = torch.randn(h, generator=g)
    idx = layer_key_indices(seq, 4, indexer_topk(torch.randn(seq, 3, generator=g).masked_fill(
        ~causal_entry_mask(torch.arange(seq), 3), float("-inf")), 2), window=8)
    wo_a, wo_b = _proj_weights(g, h, groups, 8, 16)
    pos = torch.arange(seq)
    freqs = rope_freqs(COMPRESSED_ROPE)
    ref = attention(q, kv, idx, sink, pos, freqs, wo_a, wo_b, groups)
    low = attention_lowprec(q, kv, idx, sink, pos, freqs, wo_a.bfloat16(), wo_b.bfloat16(), groups)
    assert ref.shape == low.shape == (1, seq, 16)
    rel = (low.double() - ref.double()).norm() / ref.double().norm()
    assert 1e-4 < rel < 3e-2
