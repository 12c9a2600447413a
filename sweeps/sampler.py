"""Sampler case space (spec §9.3): the 129,280-token vocabulary; decode batches of 1 to 256 rows
(with MTP a request samples 2 tokens per step); the CLI default temperature 0.6, greedy (T = 0) and
T = 1; hypothesis extras over small vocabularies, ragged row counts and temperatures."""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

VOCAB = 129280


def case(b: int, temperature: float, vocab: int = VOCAB) -> dict:
    return {"b": b, "v": vocab, "temperature": temperature}


def production() -> list[dict]:
    return [case(b, 0.6) for b in (1, 64, 128, 256)] + [case(64, 0.0), case(33, 1.0)]


def extra_strategy() -> st.SearchStrategy[dict]:
    vocab = st.one_of(st.sampled_from([4, 1024, 1028, 4096 * 64, VOCAB]), st.integers(1, 40000).map(lambda k: 4 * k))
    temperature = st.sampled_from([0.0, 1e-6, 0.3, 0.6, 1.0, 2.0])
    return st.builds(case, tile_counts(8, 40), temperature, vocab)


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
