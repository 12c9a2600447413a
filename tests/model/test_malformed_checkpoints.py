"""Malformed checkpoints (issue #27, defect 7): each variant fails in `Checkpoint.open` with one
`CheckpointError` naming the file and the tensor or key, never a traceback from deep inside the
loader or mid-generation; through the CLI each one exits 2 with that message and no traceback.

Every variant starts from a fresh copy of a synthetic tiny checkpoint and breaks one thing.
"""

import json
import math
import shutil
import struct
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from dsv4bench.model.config import TINY
from dsv4bench.model.inventory import INDEX_NAME, group_of, groups
from dsv4bench.model.loader import Checkpoint, CheckpointError
from dsv4bench.model.synth import shard_name, write_checkpoint

UNITS = groups(TINY)
SINK = "layers.1.attn.attn_sink"  # F32[4]
NORM_A, NORM_F = "layers.0.attn_norm.weight", "layers.0.ffn_norm.weight"  # both BF16[64]
TID = "layers.1.ffn.gate.tid2eid"  # I64[vocab, 2], hash-routed layer


def shard(tensor: str) -> str:
    return shard_name(UNITS.index(group_of(tensor)), len(UNITS))


# ---- raw file surgery --------------------------------------------------------------------------

def read_st(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data, length=None):
    h = header if isinstance(header, bytes) else header.encode()
    path.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)


def edit_header(root, tensor, fn):
    """fn(header dict) edits the header of the shard holding `tensor` in place."""
    path = root / shard(tensor)
    meta, data = read_st(path)
    fn(meta)
    write_st(path, json.dumps(meta), data)


def set_entry(root, tensor, fn):
    """fn(entry dict) returns the new header entry of `tensor`."""
    edit_header(root, tensor, lambda meta: meta.__setitem__(tensor, fn(meta[tensor])))


def with_keys(entry, **changes):
    return {**entry, **changes}


def without(entry, key):
    return {k: v for k, v in entry.items() if k != key}


def edit_json(root, name, fn):
    path = root / name
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def set_config(root, key, value):
    edit_json(root, "config.json", lambda d: d.__setitem__(key, value))


def rewrite_tensors(root, tensor, fn):
    """fn(tensors dict) edits the tensors of the shard holding `tensor`; the shard is rewritten."""
    path = root / shard(tensor)
    tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def save_tokenizer(root, vocab):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(root / "tokenizer.json"))


# ---- the variants: each breaks one thing; the needles must all appear in the message ----------

VARIANTS = []


def variant(*needles):
    def register(fn):
        VARIANTS.append(pytest.param(fn, needles, id=fn.__name__))
        return fn
    return register


# safetensors headers


@variant(shard(SINK), "JSON object")
def header_is_a_list(root):
    path = root / shard(SINK)
    meta, data = read_st(path)
    write_st(path, json.dumps(list(meta)), data)


@variant(shard(SINK), SINK)
def entry_is_not_an_object(root):
    set_entry(root, SINK, lambda e: 5)


@variant(shard(SINK), SINK, "dtype")
def entry_without_dtype(root):
    set_entry(root, SINK, lambda e: without(e, "dtype"))


@variant(shard(SINK), SINK, "data_offsets")
def entry_without_data_offsets(root):
    set_entry(root, SINK, lambda e: without(e, "data_offsets"))


@variant(shard(SINK), SINK, "shape")
def entry_without_shape(root):
    set_entry(root, SINK, lambda e: without(e, "shape"))


@variant(shard(SINK), SINK, "dtype")
def dtype_is_not_a_string(root):
    set_entry(root, SINK, lambda e: with_keys(e, dtype=["F32"]))


@variant(shard(SINK), SINK, "F12")
def unknown_dtype(root):
    set_entry(root, SINK, lambda e: with_keys(e, dtype="F12"))


@variant(shard(SINK), SINK, "shape")
def shape_is_not_a_list(root):
    set_entry(root, SINK, lambda e: with_keys(e, shape="4"))


@variant(shard(SINK), SINK, "shape")
def shape_holds_a_float(root):
    set_entry(root, SINK, lambda e: with_keys(e, shape=[4.0]))


@variant(shard(SINK), SINK, "shape")
def shape_is_negative(root):
    set_entry(root, SINK, lambda e: with_keys(e, shape=[-4], data_offsets=e["data_offsets"][::-1]))


@variant(shard(SINK), SINK, "data_offsets")
def data_offsets_of_one_number(root):
    set_entry(root, SINK, lambda e: with_keys(e, data_offsets=e["data_offsets"][:1]))


@variant(shard(SINK), SINK, "data_offsets")
def data_offsets_are_strings(root):
    set_entry(root, SINK, lambda e: with_keys(e, data_offsets=[str(x) for x in e["data_offsets"]]))


@variant(shard(SINK), SINK, "data_offsets")
def negative_data_offsets(root):  # the byte count matches and the end lies inside the file
    n = 4 * 4
    set_entry(root, SINK, lambda e: with_keys(e, data_offsets=[-n, 0]))


@variant(shard(NORM_F), NORM_F, NORM_A, "overlap")
def overlapping_data_offsets(root):
    edit_header(root, NORM_F, lambda m: m[NORM_F].__setitem__("data_offsets", m[NORM_A]["data_offsets"]))


@variant(shard(SINK), SINK)
def data_offsets_past_the_end(root):
    size = len(read_st(root / shard(SINK))[1])
    set_entry(root, SINK, lambda e: with_keys(e, data_offsets=[size, size + 16]))


@variant(shard(SINK), SINK, "dtype x shape")
def shape_does_not_match_the_byte_count(root):
    set_entry(root, SINK, lambda e: with_keys(e, shape=[5]))


@variant(shard(SINK), SINK, "more than once")
def duplicate_name_in_one_header(root):
    path = root / shard(SINK)
    meta, data = read_st(path)
    text = json.dumps(meta)[:-1] + f", {json.dumps(SINK)}: {json.dumps(meta[SINK])}}}"
    write_st(path, text, data)


@variant(SINK, shard(SINK), shard(NORM_A))
def tensor_in_two_shards(root):
    rewrite_tensors(root, NORM_A, lambda t: t.__setitem__(SINK, load_file(str(root / shard(SINK)))[SINK]))


@variant(shard(SINK), "__metadata__")
def metadata_value_is_not_a_string(root):
    edit_header(root, SINK, lambda m: m.__setitem__("__metadata__", {"format": 5}))


@variant(shard(SINK), "after the last tensor")
def trailing_bytes(root):
    path = root / shard(SINK)
    path.write_bytes(path.read_bytes() + bytes(16))


@variant(shard(SINK), "its header alone needs")
def header_length_beyond_the_file(root):
    path = root / shard(SINK)
    meta, data = read_st(path)
    header = json.dumps(meta)
    write_st(path, header, data, length=len(header) + len(data) + 1)  # one byte more than the file holds


@variant(shard(SINK), "truncated")
def truncated_shard(root):
    path = root / shard(SINK)
    path.write_bytes(path.read_bytes()[:-8])


@variant(shard(SINK), "UTF-8")
def header_is_not_utf8(root):
    path = root / shard(SINK)
    meta, data = read_st(path)
    write_st(path, json.dumps(meta).encode().replace(b"attn_sink", b"attn_s\xffnk"), data)


# config.json


@variant("config.json", "UTF-8")
def config_is_not_utf8(root):
    (root / "config.json").write_bytes(b'{"dsv4bench_name": "\xff"}')


@variant("config.json", "JSON object")
def config_is_a_list(root):
    (root / "config.json").write_text("[1, 2]")


@variant("config.json", "hidden_size")
def config_string_for_an_integer(root):
    set_config(root, "hidden_size", "64")


@variant("config.json", "num_attention_heads")
def config_boolean_for_an_integer(root):
    set_config(root, "num_attention_heads", True)


@variant("config.json", "compress_ratios")
def config_ratios_are_a_string(root):
    set_config(root, "compress_ratios", "0,4,128,4,0")


@variant("config.json", "compress_ratios")
def config_ratio_is_a_string(root):
    set_config(root, "compress_ratios", [0, "4", 128, 4, 0])


@variant("config.json", "routed_scaling_factor")
def config_string_for_a_number(root):
    set_config(root, "routed_scaling_factor", "1.5")


@variant("config.json", "rope_scaling")
def config_rope_scaling_is_a_number(root):
    set_config(root, "rope_scaling", 16)


@variant("config.json", "rope_scaling.factor")
def config_rope_factor_is_a_string(root):
    edit_json(root, "config.json", lambda d: d["rope_scaling"].__setitem__("factor", "16"))


@variant("config.json", "o_groups")
def config_zero_o_groups(root):
    set_config(root, "o_groups", 0)


@variant("config.json", "num_hidden_layers")
def config_negative_layer_count(root):
    set_config(root, "num_hidden_layers", -1)


@variant("config.json", "rms_norm_eps")
def config_nan(root):
    set_config(root, "rms_norm_eps", math.nan)


@variant("config.json", "dsv4bench_name")
def config_name_is_a_number(root):
    set_config(root, "dsv4bench_name", 5)


@variant("config.json", "bos_token_id")
def config_bos_beyond_the_vocab(root):
    set_config(root, "bos_token_id", TINY.vocab_size)


@variant("config.json", "hidden_size", "more than once")
def config_duplicate_key(root):
    text = (root / "config.json").read_text().rstrip()
    (root / "config.json").write_text(text[:-1] + ', "hidden_size": 128}')


# the index


@variant(INDEX_NAME, "UTF-8")
def index_is_not_utf8(root):
    (root / INDEX_NAME).write_bytes(b'{"weight_map": {"\xff": 1}}')


@variant(INDEX_NAME, "JSON object")
def index_is_a_list(root):
    (root / INDEX_NAME).write_text("[]")


@variant(INDEX_NAME, "weight_map")
def index_weight_map_is_a_list(root):
    edit_json(root, INDEX_NAME, lambda d: d.__setitem__("weight_map", list(d["weight_map"])))


@variant(INDEX_NAME, "weight_map")
def index_without_weight_map(root):
    edit_json(root, INDEX_NAME, lambda d: d.pop("weight_map"))


@variant(INDEX_NAME, SINK)
def index_shard_is_a_number(root):
    edit_json(root, INDEX_NAME, lambda d: d["weight_map"].__setitem__(SINK, 5))


@variant(INDEX_NAME, SINK)
def index_shard_outside_the_directory(root):
    edit_json(root, INDEX_NAME, lambda d: d["weight_map"].__setitem__(SINK, f"../{shard(SINK)}"))


# tid2eid values (the hash layers' expert ids): an IndexError mid-generation before


@variant(shard(TID), TID, "n_routed_experts")
def tid2eid_beyond_the_experts(root):
    rewrite_tensors(root, TID, lambda t: t[TID][0].fill_(TINY.n_routed_experts))  # row 0 = BOS


@variant(shard(TID), TID, "n_routed_experts")
def tid2eid_negative(root):
    rewrite_tensors(root, TID, lambda t: t[TID][0, 1].fill_(-1))


# tokenizer.json


@variant("tokenizer.json", "line 1 column 10")
def tokenizer_is_not_json(root):
    (root / "tokenizer.json").write_text('{"model": ')


@variant("tokenizer.json", "UTF-8")
def tokenizer_is_not_utf8(root):
    (root / "tokenizer.json").write_bytes(b'{"\xff": 1}')


@variant("tokenizer.json", "tokenizer")
def tokenizer_json_is_not_a_tokenizer(root):
    (root / "tokenizer.json").write_text('{"model": 5}')


@variant("tokenizer.json", "'far'", "vocab_size")
def tokenizer_id_beyond_the_vocab(root):
    save_tokenizer(root, {"[UNK]": 2, "far": TINY.vocab_size + 88})


# ---- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_checkpoint(TINY, tmp_path_factory.mktemp("pristine"), seed=3)


@pytest.fixture
def broken(pristine, tmp_path, request):
    mutate = request.param
    root = tmp_path / "ckpt"
    shutil.copytree(pristine, root)
    mutate(root)
    return root


@pytest.mark.parametrize("broken, needles", VARIANTS, indirect=["broken"])
def test_open_raises_one_error_naming_the_file_and_the_tensor(broken, needles):
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(broken)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


@pytest.mark.parametrize("broken, needles", VARIANTS, indirect=["broken"])
def test_run_model_exits_2_with_the_message(broken, needles, monkeypatch, capsys):
    from dsv4bench.cli.main import main

    monkeypatch.setattr(sys, "argv", ["dsv4bench", "run-model", "--prompt", "hi", "--checkpoint", str(broken),
                                      "--max-new-tokens", "2"])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    assert e.value.code == 2, out.out + out.err
    assert "error:" in out.out and "Traceback" not in out.out + out.err
    for needle in needles:
        assert needle in out.out, (needle, out.out)


@pytest.mark.parametrize("broken", [tid2eid_beyond_the_experts], indirect=True)
def test_python_m_dsv4bench_exits_2_without_traceback(broken):
    """End to end in a fresh interpreter: the case that used to fail mid-generation."""
    r = subprocess.run([sys.executable, "-m", "dsv4bench", "run-model", "--prompt", "hi", "--checkpoint",
                        str(broken), "--max-new-tokens", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert TID in r.stdout


def test_a_shard_changed_after_open_fails_on_load(pristine, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(pristine, root)
    ckpt = Checkpoint.open(root)
    path = root / shard(SINK)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match=f"{path.name}"):
        ckpt.load_group("layers.1")
