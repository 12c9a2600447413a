import torch
from hypothesis import given, settings, strategies as st

from oracles.linear import QuantWeight, dequant
from oracles.projections import kv_projection, kv_projection_lowprec, q_projection, q_projection_lowprec
from oracles.quant import fp8_block_quant, quant_fp8_weight
from oracles.rope import COMPRESSED_ROPE, SWA_ROPE, apply_rope, rope_freqs

SETTINGS = settings(max_examples=6, deadline=None)
seeds = st.integers(0, 2**31 - 1)
D, Q_LORA, H, HD = 128, 128, 2, 512


def _setup(seed, cfg):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, D, generator=g).bfloat16()
    w = dict(
        wq_a=QuantWeight(*quant_fp8_weight(torch.randn(Q_LORA, D, generator=g) * 0.06)),
        q_norm=1 + 0.1 * torch.randn(Q_LORA, generator=g),
        wq_b=QuantWeight(*quant_fp8_weight(torch.randn(H * HD, Q_LORA, generator=g) * 0.09)),
        wkv=QuantWeight(*quant_fp8_weight(torch.randn(HD, D, generator=g) * 0.06)),
        kv_norm=1 + 0.1 * torch.randn(HD, generator=g),
    )
    pos = torch.randint(0, 70_000, (2, 5), generator=g)
    return x, w, pos, rope_freqs(cfg)


@SETTINGS
@given(seed=seeds, cfg=st.sampled_from([SWA_ROPE, COMPRESSED_ROPE]))
def test_q_heads_are_unit_rms_and_unrotate_to_the_normalised_projection(seed, cfg):
    x, w, pos, freqs = _setup(seed, cfg)
    q, qr = q_projection(x, w["wq_a"], w["q_norm"], w["wq_b"], H, pos, freqs)
    assert q.shape == (2, 5, H, HD) and qr.shape == (2, 5, Q_LORA)
    torch.testing.assert_close(q.square().mean(-1), torch.ones(2, 5, H), rtol=1e-4, atol=0)
    # independent fp64 recomputation of the pre-RoPE q
    a = x.double() @ dequant(w["wq_a"]).double().T
    qr64 = a / a.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w["q_norm"].double()
    torch.testing.assert_close(qr.double(), qr64, rtol=1e-4, atol=1e-5)
    b = (qr64 @ dequant(w["wq_b"]).double().T).unflatten(-1, (H, HD))
    b = b / b.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    unrotated = apply_rope(q, pos.unsqueeze(-1), freqs, inverse=True).double()  # same fp32 angles
    torch.testing.assert_close(unrotated, b, rtol=1e-3, atol=1e-4)


@SETTINGS
@given(seed=seeds, cfg=st.sampled_from([SWA_ROPE, COMPRESSED_ROPE]))
def test_kv_nope_dims_are_fp8_qdq_of_the_normed_latent_and_rope_dims_stay_exact(seed, cfg):
    x, w, pos, freqs = _setup(seed, cfg)
    plain = kv_projection(x, w["wkv"], w["kv_norm"], pos, freqs, qat=False)
    kv = kv_projection(x, w["wkv"], w["kv_norm"], pos, freqs)
    assert kv.shape == (2, 5, HD)
    assert torch.equal(kv[..., 448:], plain[..., 448:])
    codes, scale = fp8_block_quant(plain[..., :448], 64)
    assert scale.shape == (2, 5, 7)
    assert torch.equal(kv[..., :448], (codes.float().unflatten(-1, (7, 64)) * scale.unsqueeze(-1)).flatten(-2))
    rel = (kv[..., :448] - plain[..., :448]).norm() / plain[..., :448].norm()
    assert 1e-3 < rel < 0.05  # the QAT noise of e4m3
    # the pre-RoPE latent has the kv_norm weight's RMS profile
    unrot = apply_rope(plain, pos, freqs, inverse=True)
    torch.testing.assert_close((unrot / w["kv_norm"]).square().mean(-1), torch.ones(2, 5), rtol=1e-4, atol=0)


@SETTINGS
@given(seed=seeds)
def test_lowprec_projections_track_the_oracle_in_bf16(seed):
    x, w, pos, freqs = _setup(seed, COMPRESSED_ROPE)
    q, qr = q_projection(x, w["wq_a"], w["q_norm"], w["wq_b"], H, pos, freqs)
    q_low, qr_low = q_projection_lowprec(x, w["wq_a"], w["q_norm"], w["wq_b"], H, pos, freqs)
    kv = kv_projection(x, w["wkv"], w["kv_norm"], pos, freqs, qat=False)
    kv_low = kv_projection_lowprec(x, w["wkv"], w["kv_norm"], pos, freqs, qat=False)
    for low, ref in ((q_low, q), (qr_low, qr), (kv_low, kv)):
        assert low.dtype == torch.bfloat16
        rel = (low.double() - ref.double()).norm() / ref.double().norm()
        assert 1e-4 < rel < 5e-2, rel  # act-quant + bf16 noise, but no structural error
    kv_qat_low = kv_projection_lowprec(x, w["wkv"], w["kv_norm"], pos, freqs)
    codes, scale = fp8_block_quant(kv_qat_low[..., :448], 64)
    assert torch.equal((codes.float().unflatten(-1, (7, 64)) * scale.unsqueeze(-1)).flatten(-2),
                       kv_qat_low[..., :448].float()), "the bf16 cache rows are exactly on the FP8 grid"
