"""The reference engine: weights, caches and the generate loop around `oracles/model.py`.

`Engine.feed(ids)` runs the main model on the next tokens (a whole prompt = prefill, one token
= decode; any chunk size works) on top of the caches, and the MTP block on the streams that now
have their next token. It returns the main logits of the last position and the MTP draft logits
for the same next token: MTP(h_{t-1}, embed(x_t)) predicts x_{t+1}, as the main model's logits
at t do, which is what speculative decoding would have proposed one step earlier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from dsv4bench.model.cache import LayerCache
from dsv4bench.model.dispatch import OpTable
from dsv4bench.model.loader import Checkpoint
from dsv4bench.model.weights import to_params
from oracles import model as M


@dataclass
class StepOutput:
    logits: torch.Tensor  # [V] fp32 (or [S, V] when all_logits)
    draft_logits: torch.Tensor | None  # MTP's logits for the same next token; None before any


class Engine:
    def __init__(self, ckpt: Checkpoint, device: str = "cpu", ops: OpTable | None = None,
                 progress: Callable[[str], None] | None = None):
        self.cfg = ckpt.config
        self.device = torch.device(device)
        self.ops = ops or OpTable()
        self.top = to_params(ckpt.load_group("top", self.device), "")
        self.layers = []
        for i in range(self.cfg.n_layers):  # one load unit at a time
            self.layers.append(to_params(ckpt.load_group(f"layers.{i}", self.device), f"layers.{i}."))
            if progress:
                progress(f"layers.{i}")
        self.mtp = [to_params(ckpt.load_group(f"mtp.{k}", self.device), f"mtp.{k}.")
                    for k in range(self.cfg.n_mtp_layers)]
        self.reset()

    def reset(self) -> None:
        cfg = self.cfg
        self.caches = [LayerCache(cfg, i, self.device) for i in range(cfg.n_layers)]
        self.mtp_cache = LayerCache(cfg, cfg.n_layers, self.device) if self.mtp else None
        self.pos = 0
        self._pending: torch.Tensor | None = None  # last streams still waiting for their next token

    def cache_bytes(self) -> int:
        caches = self.caches + ([self.mtp_cache] if self.mtp_cache else [])
        return sum(c.nbytes() for c in caches)

    @torch.no_grad()
    def feed(self, ids: list[int] | torch.Tensor, all_logits: bool = False) -> StepOutput:
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(-1)
        if self.pos + ids.numel() > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence would exceed max_position_embeddings={self.cfg.max_position_embeddings}")
        logits, X = M.forward(self.top, self.layers, ids, self.pos, self.caches, self.ops, self.cfg, all_logits)
        draft = self._mtp(X, ids, all_logits)
        self.pos += ids.numel()
        return StepOutput(logits if all_logits else logits[-1], draft)

    def _mtp(self, X: torch.Tensor, ids: torch.Tensor, all_logits: bool) -> torch.Tensor | None:
        if not self.mtp:
            return None
        if self._pending is None:  # first chunk: position 0 has no earlier streams waiting
            streams, nxt, start = X[:-1], ids[1:], self.pos
        else:  # the previous chunk's last streams (position pos-1) now have their next token
            streams, nxt, start = torch.cat([self._pending, X[:-1]]), ids, self.pos - 1
        self._pending = X[-1:]
        if nxt.numel() == 0:
            return None
        draft = M.mtp_forward(self.top, self.mtp[0], streams, nxt, start, self.mtp_cache, self.ops, self.cfg,
                              all_logits=all_logits)
        return draft if all_logits else draft[-1]

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, stop_at_eos: bool = True) -> Iterator[tuple[int, StepOutput]]:
        """Prefill the prompt, then sample and decode one token at a time.

        Yields (token, the step output whose logits it was sampled from).
        """
        if not prompt:
            raise ValueError("empty prompt")
        self.reset()
        gen = torch.Generator().manual_seed(seed)
        out = self.feed(prompt)
        for i in range(max_new_tokens):
            tok = int(self.ops.sample(out.logits.float().cpu(), temperature, gen))  # CPU noise: same on any device
            yield tok, out
            if (stop_at_eos and tok == self.cfg.eos_token_id) or i == max_new_tokens - 1:
                return
            out = self.feed([tok])


def compare_to_oracle(ckpt: Checkpoint, device: str, tokens: list[int], outputs: list[StepOutput]) -> list[float]:
    """Max relative logits error of each step of a run against the all-oracle FP32 model.

    tokens: prompt + generated tokens; outputs[i]: the step that sampled generated token i.
    The oracle recomputes every step in one prefill (row t = the logits after tokens[:t+1]).
    """
    ref = Engine(ckpt, device=device).feed(tokens[: len(tokens) - 1], all_logits=True).logits
    first = len(tokens) - len(outputs) - 1
    return [((o.logits - ref[first + i]).abs().max() / ref[first + i].abs().max()).item()
            for i, o in enumerate(outputs)]
