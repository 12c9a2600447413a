"""The reference engine: weights, caches and the generate loop around `oracles/model.py`.

`Engine.feed(ids)` runs the main model on the next tokens (a whole prompt = prefill, one token
= decode; any chunk size works) on top of the caches, and the MTP block on the streams that now
have their next token. It returns the main logits of the last position and the MTP draft logits
for the same next token: MTP(h_{t-1}, embed(x_t)) predicts x_{t+1}, as the main model's logits
at t do, which is what speculative decoding would have proposed one step earlier.

A batch is B sequences at the same positions (`reset(batch=B)`, then `feed` ids [B, S]): the
official generate loop's left-aligned batch, which `generate_batch` drives.
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
    logits: torch.Tensor  # [V] fp32 (or [S, V] when all_logits); a leading [B] for batched ids
    draft_logits: torch.Tensor | None  # MTP's logits for the same next token; None before any


class Engine:
    """qat: the official model's quantisation-aware round trips (oracles/model.py), on by default."""

    def __init__(self, ckpt: Checkpoint, device: str = "cpu", ops: OpTable | None = None, qat: bool = True,
                 progress: Callable[[str], None] | None = None):
        self.cfg = ckpt.config
        self.device = torch.device(device)
        self.ops = ops or OpTable()
        self.qat = qat
        self.top = to_params(ckpt.load_group("top", self.device), "")
        self.layers = []
        for i in range(self.cfg.n_layers):  # one load unit at a time
            self.layers.append(to_params(ckpt.load_group(f"layers.{i}", self.device), f"layers.{i}."))
            if progress:
                progress(f"layers.{i}")
        self.mtp = [to_params(ckpt.load_group(f"mtp.{k}", self.device), f"mtp.{k}.")
                    for k in range(self.cfg.n_mtp_layers)]
        self.reset()

    def reset(self, batch: int = 1) -> None:
        cfg = self.cfg
        self.batch = batch
        self.caches = [LayerCache(cfg, i, self.device, batch) for i in range(cfg.n_layers)]
        self.mtp_cache = LayerCache(cfg, cfg.n_layers, self.device, batch) if self.mtp else None
        self.pos = 0
        self._pending: torch.Tensor | None = None  # last streams still waiting for their next token

    def cache_bytes(self) -> int:
        caches = self.caches + ([self.mtp_cache] if self.mtp_cache else [])
        return sum(c.nbytes() for c in caches)

    @torch.no_grad()
    def feed(self, ids: list | torch.Tensor, all_logits: bool = False) -> StepOutput:
        """ids [S] (one sequence) or [B, S] (the batch `reset` made caches for)."""
        ids = torch.as_tensor(ids, dtype=torch.long)  # host ids stay on the host for the range check
        self._check_vocab(ids)
        ids = ids.to(self.device)
        single = ids.dim() <= 1
        ids = ids.reshape(1, -1) if single else ids
        if ids.dim() != 2 or ids.shape[0] != self.batch:
            raise ValueError(f"ids of shape {tuple(ids.shape)} for caches of a batch of {self.batch} "
                             f"(reset(batch=B) first, then feed [B, S])")
        if self.pos + ids.shape[1] > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence would exceed max_position_embeddings={self.cfg.max_position_embeddings}")
        logits, X = M.forward(self.top, self.layers, ids, self.pos, self.caches, self.ops, self.cfg, self.qat,
                              all_logits)
        draft = self._mtp(X, ids, all_logits)
        self.pos += ids.shape[1]
        if not all_logits:
            logits, draft = logits[:, -1], None if draft is None else draft[:, -1]
        if single:
            logits, draft = logits[0], None if draft is None else draft[0]
        return StepOutput(logits, draft)

    def _check_vocab(self, ids: torch.Tensor) -> None:
        """Every id in [0, vocab_size), or ValueError naming the first one outside: on the GPU an
        out-of-range gather traps and takes the CUDA context down with it. A host read (free for the
        host lists the generate loop feeds; one sync for ids already on the GPU)."""
        lo, hi = (int(v) for v in torch.aminmax(ids)) if ids.numel() else (0, 0)
        if lo < 0 or hi >= self.cfg.vocab_size:
            bad = ((ids < 0) | (ids >= self.cfg.vocab_size)).nonzero()[0].tolist()
            raise ValueError(f"token id {int(ids[tuple(bad)])} at index {tuple(bad)} is outside the vocabulary "
                             f"[0, {self.cfg.vocab_size})")

    def _mtp(self, X: torch.Tensor, ids: torch.Tensor, all_logits: bool) -> torch.Tensor | None:
        if not self.mtp:
            return None
        if self._pending is None:  # first chunk: position 0 has no earlier streams waiting
            streams, nxt, start = X[:, :-1], ids[:, 1:], self.pos
        else:  # the previous chunk's last streams (position pos-1) now have their next token
            streams, nxt, start = torch.cat([self._pending, X[:, :-1]], dim=1), ids, self.pos - 1
        self._pending = X[:, -1:]
        if nxt.shape[1] == 0:
            return None
        return M.mtp_forward(self.top, self.mtp[0], streams, nxt, start, self.mtp_cache, self.ops, self.cfg,
                             self.qat, all_logits=all_logits)

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, stop_at_eos: bool = True) -> Iterator[tuple[int, StepOutput]]:
        """Prefill the prompt, then sample and decode one token at a time.

        Yields (token, the step output whose logits it was sampled from).
        """
        for _, tok, out in self.generate_batch([prompt], max_new_tokens, temperature, seed, stop_at_eos):
            yield tok, out

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                       seed: int = 0, stop_at_eos: bool = True) -> Iterator[tuple[int, int, StepOutput]]:
        """The official generate loop on prompts of any lengths (spec §9.3): one left-aligned batch;
        prefill the first min(len) tokens of every prompt, then one token per step, where a
        sequence still inside its prompt is fed its next prompt token instead of a sampled one.

        Each sequence samples with its own generator seeded `seed` and draws noise only for the
        tokens it keeps, so it gets the tokens it gets alone. A sequence stops at EOS or after
        max_new_tokens; the batch runs until every sequence has stopped.
        Yields (sequence, token, its step output), in step order.
        """
        if not prompts or not all(prompts):
            raise ValueError("empty prompt")
        lens = [len(p) for p in prompts]
        self.reset(len(prompts))
        gens = [torch.Generator().manual_seed(seed) for _ in prompts]
        kept = [0] * len(prompts)
        done = [max_new_tokens < 1] * len(prompts)
        cur = min(lens)
        out = self.feed([p[:cur] for p in prompts])
        while not all(done):
            nxt = []
            for b, p in enumerate(prompts):
                if cur < lens[b] or done[b]:  # inside its prompt: forced; stopped: anything (ignored)
                    nxt.append(p[cur] if cur < lens[b] else self.cfg.eos_token_id)
                    continue
                row = StepOutput(out.logits[b], None if out.draft_logits is None else out.draft_logits[b])
                tok = int(self.ops.sample(row.logits, temperature, gens[b]))  # CPU noise: any device
                yield b, tok, row
                kept[b] += 1
                done[b] = (stop_at_eos and tok == self.cfg.eos_token_id) or kept[b] == max_new_tokens
                nxt.append(tok)
            if all(done):
                return
            out = self.feed([[t] for t in nxt])
            cur += 1
