"""The tensor inventory reproduces the official checkpoints from the config alone (§11.3)."""

import pytest

from dsv4bench.model.config import CONFIGS, FLASH, PRO, TINY, ConfigError, get_config
from dsv4bench.model.inventory import dtype_counts, expected_tensors, group_of, groups


def test_flash_inventory_matches_official_audit():
    inv = expected_tensors(FLASH)
    assert len(inv) == 69_187
    assert dict(dtype_counts(inv)) == {
        "BF16": 433, "F32": 417, "F8_E4M3": 375, "F8_E8M0": 34_167, "I64": 3, "I8": 33_792,
    }
    assert inv["layers.0.ffn.experts.255.w1.weight"].shape == (2048, 2048)
    assert inv["layers.0.ffn.experts.0.w2.scale"].shape == (4096, 64)
    assert inv["layers.3.attn.compressor.ape"].shape == (128, 512)
    assert inv["layers.2.attn.indexer.compressor.ape"].shape == (4, 256)
    assert inv["layers.2.ffn.gate.tid2eid"].shape == (129280, 6)
    assert "layers.3.ffn.gate.tid2eid" not in inv and "layers.3.ffn.gate.bias" in inv
    assert not any(n.startswith("mtp.0.attn.compressor") for n in inv)  # MTP is SWA-only


def test_pro_inventory_matches_official_index():
    inv = expected_tensors(PRO)
    assert len(inv) == 145_116
    assert inv["layers.0.attn.wq_a.scale"].shape == (12, 56)
    assert inv["layers.0.attn.wo_a.weight"].shape == (16384, 4096)
    assert inv["layers.5.ffn.experts.383.w3.weight"].shape == (3072, 3584)
    assert sum(n.endswith("compressor.ape") and ".indexer." not in n for n in inv) == 61


def test_tiny_keeps_every_code_path():
    kinds = [TINY.kind(i) for i in range(TINY.n_layers)]
    assert {"swa", "csa", "hca"} <= set(kinds)
    hashed = [TINY.is_hash(i) for i in range(TINY.n_layers)]
    assert any(hashed) and not all(hashed)
    assert TINY.kind(TINY.n_layers) == "swa" and TINY.n_mtp_layers == 1
    assert TINY.window_size == 128 and TINY.rope_head_dim == 64


def test_every_tensor_belongs_to_exactly_one_group():
    inv = expected_tensors(TINY)
    assert {group_of(n) for n in inv} == set(groups(TINY))


def test_nvfp4_experts_change_only_the_expert_tensors():
    base, nv = expected_tensors(TINY), expected_tensors(TINY.with_(expert_dtype="nvfp4"))
    assert {n for n in base if ".experts." not in n} == {n for n in nv if ".experts." not in n}
    w = nv["layers.0.ffn.experts.3.w2.weight"]
    assert (w.shape, w.dtype) == ((TINY.dim, TINY.moe_inter_dim // 2), "U8")
    assert nv["layers.0.ffn.experts.3.w2.weight_scale"].shape == (TINY.dim, TINY.moe_inter_dim // 16)
    assert nv["layers.0.ffn.experts.3.w2.weight_scale_2"].shape == ()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_hf_round_trip(name):
    cfg = get_config(name)
    assert type(cfg).from_hf(cfg.to_hf()) == cfg


def test_bad_configs_name_the_problem():
    with pytest.raises(ConfigError, match="unknown config 'huge'"):
        get_config("huge")
    with pytest.raises(ConfigError, match="compress_ratios has 4 entries"):
        TINY.with_(compress_ratios=(0, 4, 128, 4))
    with pytest.raises(ConfigError, match="unsupported ratios \\[8\\]"):
        TINY.with_(compress_ratios=(0, 8, 128, 4, 0))
    with pytest.raises(ConfigError, match="missing the key 'hidden_size'"):
        type(TINY).from_hf({k: v for k, v in TINY.to_hf().items() if k != "hidden_size"})
