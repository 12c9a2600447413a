"""Per-layer inference caches (docs/model-math.md §10.1), FP32, for a batch of B sequences that
are all at the same position (the official generate loop's left-aligned batch).

* the window ring: `ring [B, window, head_dim]`, token p in slot p mod window (raw KV after the
  norm and RoPE, and the FP8 round trip when the model runs with QAT);
* the compressed KV entries `comp_kv [B, n, head_dim]` (entry s at row s);
* the compressor state: the reference's `kv_state` / `score_state` (`oracles.compressor.
  CompressorState`: HCA the current block; CSA the previous and the current block, which the
  next entry overlaps);
* for CSA layers the indexer's own compressor state and its key cache `idx_keys [B, n, 128]`.

`oracles/model.py` reads and updates these through the protocol its docstring describes.
"""

from __future__ import annotations

import torch

from dsv4bench.model.config import ModelConfig
from oracles.compressor import CompressorState
from oracles.rope import RopeConfig, rope_freqs


def layer_rope(cfg: ModelConfig, layer: int) -> RopeConfig:
    """§2.2: ratio-0 layers (and MTP) use rope_theta without YaRN; compressed ones YaRN."""
    if cfg.ratio(layer) == 0:
        return RopeConfig(base=cfg.rope_theta, rope_dim=cfg.rope_head_dim)
    return RopeConfig(
        base=cfg.compress_rope_theta,
        original_seq_len=cfg.original_seq_len,
        factor=cfg.rope_factor,
        beta_fast=cfg.beta_fast,
        beta_slow=cfg.beta_slow,
        rope_dim=cfg.rope_head_dim,
    )


class LayerCache:
    def __init__(self, cfg: ModelConfig, layer: int, device: torch.device | str = "cpu", batch: int = 1):
        device = torch.device(device)
        self.window = cfg.window_size
        self.freqs = rope_freqs(layer_rope(cfg, layer)).to(device)
        self.ring = torch.zeros(batch, self.window, cfg.head_dim, device=device)
        self.seen = 0  # tokens pushed into the ring
        # compressor states (oracles.compressor.CompressorState), set by the first chunk (prefill)
        self.comp: CompressorState | None = None
        self.idx_comp: CompressorState | None = None
        self.comp_kv = torch.zeros(batch, 0, cfg.head_dim, device=device)
        self.idx_keys = torch.zeros(batch, 0, cfg.index_head_dim, device=device)

    def check_start(self, start: int) -> None:
        """A chunk must start where the cache ends."""
        if start != self.seen:
            raise ValueError(f"chunk starts at position {start} but the cache holds {self.seen} tokens")

    def window_keys(self, kv_new: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_new [B, S, d] at positions pos [S] → (rows [B, window + S, d] = [ring slots | new kv],
        indices [S, window], the same for every sequence: query t's keys t-window+1..t, -1 if < 0).

        A position p older than the chunk lives in ring slot p mod window; a new one at row
        window + (p - start).
        """
        start = self.seen  # the chunk's first position (forward checks it on the host: no device read)
        w = self.window
        p = pos[:, None] - (w - 1) + torch.arange(w, device=pos.device)[None, :]
        rows = torch.where(p >= start, w + (p - start), p % w)
        return torch.cat([self.ring, kv_new.float()], dim=1), torch.where(p >= 0, rows, -1)

    def push_window(self, kv_new: torch.Tensor, pos: torch.Tensor) -> None:
        keep = kv_new[:, -self.window:], pos[-self.window:]
        self.ring[:, keep[1] % self.window] = keep[0].float()
        self.seen += pos.shape[0]

    def nbytes(self) -> int:
        ts = [self.ring, self.comp_kv, self.idx_keys]
        for st in (self.comp, self.idx_comp):
            if st is not None:
                ts += [st.kv, st.score]
        return sum(t.numel() * t.element_size() for t in ts)
