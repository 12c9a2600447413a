"""Tokenizers: the checkpoint's own `tokenizer.json` through HF `tokenizers` when present,
otherwise a byte-level fallback.

Byte-level fallback (documented in docs/model.md): the text is UTF-8 encoded and byte b becomes
id `b + BYTE_OFFSET` (BYTE_OFFSET = 2, so ids 0 and 1 stay BOS / EOS as in the real config).
Decoding maps those ids back to bytes (invalid UTF-8 shows as U+FFFD); BOS/EOS are dropped and
any other id (the synthetic vocab is larger than 258) is shown as `<id>`.

Both add the config's BOS id in front of the prompt, as the reference chat template does.

A `tokenizer.json` that does not load, or holds ids beyond the config's vocab_size, raises
`CheckpointError` naming the file (`Checkpoint.open` loads it once to check).
"""

from __future__ import annotations

from pathlib import Path

from dsv4bench.model.config import ConfigError, ModelConfig
from dsv4bench.model.validate import CheckpointError, read_text

BYTE_OFFSET = 2


class ByteTokenizer:
    name = "byte-level fallback"

    def __init__(self, cfg: ModelConfig):
        if cfg.vocab_size < BYTE_OFFSET + 256:
            raise ConfigError(f"vocab_size {cfg.vocab_size} is too small for the byte-level tokenizer "
                              f"(at least {BYTE_OFFSET + 256}; or give the checkpoint a tokenizer.json)")
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
        """Raises CheckpointError naming the file when it is not a tokenizer for this vocabulary."""
        from tokenizers import Tokenizer

        text = read_text(path)
        try:
            self._tok = Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception for any JSON or schema error
            raise CheckpointError(f"{path} cannot be loaded by HF tokenizers ({e})") from None
        too_big = {t: i for t, i in self._tok.get_vocab(with_added_tokens=True).items() if i >= cfg.vocab_size}
        if too_big:
            first = min(too_big, key=too_big.get)
            raise CheckpointError(f"{path}: {len(too_big)} token(s) have ids >= vocab_size {cfg.vocab_size}, "
                                  f"the first {first!r} = {too_big[first]}")
        self.bos, self.eos = cfg.bos_token_id, cfg.eos_token_id

    def encode(self, text: str) -> list[int]:
        return [self.bos] + self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(cfg: ModelConfig, checkpoint_dir: str | Path | None = None) -> ByteTokenizer | HFTokenizer:
    if checkpoint_dir is not None:
        path = Path(checkpoint_dir) / "tokenizer.json"
        if path.is_file():
            return HFTokenizer(path, cfg)
    return ByteTokenizer(cfg)
