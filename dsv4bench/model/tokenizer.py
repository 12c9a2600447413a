"""Tokenizers: the checkpoint's own `tokenizer.json` through HF `tokenizers` when present,
otherwise a byte-level fallback.

Byte-level fallback (documented in docs/model.md): the text is UTF-8 encoded and byte b becomes
id `b + BYTE_OFFSET` (BYTE_OFFSET = 2, so ids 0 and 1 stay BOS / EOS as in the real config).
Decoding maps those ids back to bytes (invalid UTF-8 shows as U+FFFD); BOS/EOS are dropped and
any other id (the synthetic vocab is larger than 258) is shown as `<id>`.

Both add the config's BOS id in front of the prompt, as the reference chat template does.
"""

from __future__ import annotations

from pathlib import Path

from dsv4bench.model.config import ModelConfig

BYTE_OFFSET = 2


class ByteTokenizer:
    name = "byte-level fallback"

    def __init__(self, cfg: ModelConfig):
        if cfg.vocab_size < BYTE_OFFSET + 256:
            raise ValueError(f"vocab_size {cfg.vocab_size} is too small for the byte-level tokenizer")
        self.bos, self.eos = cfg.bos_token_id, cfg.eos_token_id

    def encode(self, text: str) -> list[int]:
        return [self.bos] + [b + BYTE_OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if BYTE_OFFSET <= i < BYTE_OFFSET + 256:
                buf.append(i - BYTE_OFFSET)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if i not in (self.bos, self.eos):
                out.append(f"<{i}>")
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    name = "tokenizer.json"

    def __init__(self, path: Path, cfg: ModelConfig):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.bos, self.eos = cfg.bos_token_id, cfg.eos_token_id
        self.vocab_size = cfg.vocab_size

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        too_big = [i for i in ids if i >= self.vocab_size]
        if too_big:
            raise ValueError(f"tokenizer.json produced ids {too_big[:4]} beyond vocab_size {self.vocab_size}")
        return [self.bos] + ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(cfg: ModelConfig, checkpoint_dir: str | Path | None = None) -> ByteTokenizer | HFTokenizer:
    if checkpoint_dir is not None:
        path = Path(checkpoint_dir) / "tokenizer.json"
        if path.is_file():
            return HFTokenizer(path, cfg)
    return ByteTokenizer(cfg)
