"""The byte-level fallback tokenizer round-trips any text; the HF path is used when present."""

from hypothesis import given
from hypothesis import strategies as st

from dsv4bench.model.config import TINY
from dsv4bench.model.tokenizer import BYTE_OFFSET, ByteTokenizer, HFTokenizer, load_tokenizer

tok = ByteTokenizer(TINY)


@given(st.text())
def test_byte_fallback_round_trips(text):
    ids = tok.encode(text)
    assert ids[0] == TINY.bos_token_id and len(ids) == 1 + len(text.encode("utf-8"))
    assert all(BYTE_OFFSET <= i < BYTE_OFFSET + 256 for i in ids[1:])
    assert tok.decode(ids) == text


def test_byte_fallback_decodes_specials_and_foreign_ids():
    h = [i + BYTE_OFFSET for i in b"hi"]
    assert tok.decode([TINY.bos_token_id, *h, 400, *h, TINY.eos_token_id]) == "hi<400>hi"
    assert tok.decode([0xE2 + BYTE_OFFSET]) == "\ufffd"  # a cut UTF-8 sequence


def test_load_tokenizer_prefers_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models

    assert isinstance(load_tokenizer(TINY, tmp_path), ByteTokenizer)
    Tokenizer(models.WordLevel({"a": 5, "[UNK]": 2}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    hf = load_tokenizer(TINY, tmp_path)
    assert isinstance(hf, HFTokenizer) and hf.encode("a") == [TINY.bos_token_id, 5]
