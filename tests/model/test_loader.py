"""Synthesised checkpoints load through the strict loader; corrupted ones fail with a message
naming the offending file and tensor."""

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv4bench.model.config import FLASH, TINY
from dsv4bench.model.inventory import INDEX_NAME, ST_DTYPES, expected_tensors
from dsv4bench.model.loader import Checkpoint, CheckpointError, read_header
from dsv4bench.model.synth import SynthError, make_tensor, write_checkpoint


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return write_checkpoint(TINY, tmp_path_factory.mktemp("tiny"), seed=7)


@pytest.fixture
def copy(tiny_ckpt, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, dst)
    return dst


@pytest.fixture
def victim():
    """A fresh random tensor of the inventory (not a scalar) for every test."""
    names = [n for n, s in expected_tensors(TINY).items() if len(s.shape) >= 1]
    return random.Random().choice(names)


def _shard_of(root, name):
    return root / json.loads((root / INDEX_NAME).read_text())["weight_map"][name]


def _load_copy(path):
    """The shard's tensors copied out of the memory map (so the file can be overwritten)."""
    return {k: v.clone() for k, v in load_file(str(path)).items()}


def _rewrite(root, name, fn):
    path = _shard_of(root, name)
    tensors = _load_copy(path)
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_round_trip_is_exact_and_deterministic(tiny_ckpt, tmp_path):
    ck = Checkpoint.open(tiny_ckpt)
    assert ck.config == TINY and len(ck.tensors) == len(expected_tensors(TINY))
    inv = expected_tensors(TINY)
    layer = ck.load_group("layers.2")
    for name, t in layer.items():
        want = make_tensor(name, inv[name], inv, seed=7)
        assert t.dtype == ST_DTYPES[inv[name].dtype]
        assert torch.equal(t.view(torch.uint8), want.view(torch.uint8)), name
    again = write_checkpoint(TINY, tmp_path / "again", seed=7)
    for p in sorted(tiny_ckpt.glob("*.safetensors")):
        assert p.read_bytes() == (again / p.name).read_bytes()


def test_synthetic_weights_have_fan_in_scale(tiny_ckpt):
    from oracles.quant import dequant_fp4_weight, dequant_fp8_weight

    g = Checkpoint.open(tiny_ckpt).load_group("layers.3")
    wq = dequant_fp8_weight(g["layers.3.attn.wq_a.weight"], g["layers.3.attn.wq_a.scale"])
    w1 = dequant_fp4_weight(g["layers.3.ffn.experts.5.w1.weight"], g["layers.3.ffn.experts.5.w1.scale"])
    for w in (wq, w1):
        rms = w.square().mean().sqrt().item() * w.shape[1] ** 0.5
        assert 0.3 < rms < 1.5, rms


def test_nvfp4_checkpoint_is_detected(tmp_path):
    ck = Checkpoint.open(write_checkpoint(TINY.with_(expert_dtype="nvfp4"), tmp_path / "nv"))
    assert ck.config.expert_dtype == "nvfp4"
    assert ck.load_group("layers.0")["layers.0.ffn.experts.1.w3.weight"].dtype == torch.uint8


def test_wrong_shape(copy, victim):
    _rewrite(copy, victim, lambda t: t.__setitem__(victim, torch.cat([t[victim], t[victim][:1]])))
    with pytest.raises(CheckpointError, match="wrong shape") as e:
        Checkpoint.open(copy)
    assert victim in str(e.value)


def test_wrong_dtype(copy):
    name = "layers.1.attn.attn_sink"
    _rewrite(copy, name, lambda t: t.__setitem__(name, t[name].bfloat16()))
    with pytest.raises(CheckpointError, match=f"wrong dtype in 1 tensor.*{name} is BF16\\[4\\], expected F32\\[4\\]"):
        Checkpoint.open(copy)


def test_missing_tensor(copy, victim):
    _rewrite(copy, victim, lambda t: t.pop(victim))
    index = json.loads((copy / INDEX_NAME).read_text())
    del index["weight_map"][victim]
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"missing 1 tensor\\(s\\): {victim}$"):
        Checkpoint.open(copy)


def test_missing_from_shard_but_in_index(copy, victim):
    _rewrite(copy, victim, lambda t: t.pop(victim))
    with pytest.raises(CheckpointError, match=f"lists tensor\\(s\\) absent from their shard: {victim}"):
        Checkpoint.open(copy)


def test_unexpected_tensor(copy):
    name = "layers.0.attn.compressor.ape"  # layer 0 is SWA-only: no compressor
    _rewrite(copy, "layers.0.attn.attn_sink", lambda t: t.__setitem__(name, torch.randn(4, 256)))
    with pytest.raises(CheckpointError, match=f"unexpected 1 tensor\\(s\\): {name}"):
        Checkpoint.open(copy)


def test_truncated_file(copy, victim):
    path = _shard_of(copy, victim)
    header = read_header(path)
    data = path.read_bytes()
    cut = random.randint(1, 64)
    lost = sorted(n for n, t in header.items() if t.end > len(data) - cut)
    path.write_bytes(data[: len(data) - cut])
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(copy)
    msg = str(e.value)
    assert f"{path.name} is truncated: {len(data) - cut} bytes" in msg
    assert f"{len(lost)} tensor(s) extend past the end: {', '.join(lost)}" in msg


def test_pickle_shard_is_refused(copy, victim):
    path = _shard_of(copy, victim)
    torch.save(_load_copy(path), str(path))
    with pytest.raises(CheckpointError, match=f"{path.name} is a pickle/torch.save file, not safetensors"):
        Checkpoint.open(copy)


def test_pickle_only_directory_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    torch.save({"embed.weight": torch.randn(4, 4)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only pickle checkpoints \\(pytorch_model.bin\\); safetensors only"):
        Checkpoint.open(tmp_path)


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint.open(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="has no config.json"):
        Checkpoint.open(tmp_path)


def test_synth_refuses_non_empty_target(tiny_ckpt):
    with pytest.raises(SynthError, match="already holds a checkpoint"):
        write_checkpoint(TINY, tiny_ckpt)


def test_synth_refuses_a_disk_without_room(tmp_path, monkeypatch):
    import shutil as sh

    from dsv4bench.model import synth

    monkeypatch.setattr(synth.shutil, "disk_usage", lambda p: sh._ntuple_diskusage(10**12, 10**12 - 10**9, 10**9))
    with pytest.raises(SynthError, match=r"flash needs 159\.6 GB but .* has 1\.0 GB free"):
        write_checkpoint(FLASH, tmp_path / "flash")
    assert not (tmp_path / "flash").exists()
