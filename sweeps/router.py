"""Router case space (spec §1.1, §8.1): Flash 256 experts × 1.5, Pro 384 × 2.5, top-6, score and hash
layers; decode 64 / prefill 4096 / ragged 1001 / single tokens; hypothesis extras over E and k, and `ties`:
logits on a 0.5 grid and biases on a 0.25 grid, so that equal biased scores fall inside the top-k and at its
k-th place on many rows (what the selection must break lower id first, as the oracle does)."""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, tile_counts

VOCAB = 129280
MODELS = ((256, 1.5), (384, 2.5))  # (n_routed_experts, route_scale): Flash, Pro
TOPK = 6
TOKENS = (1, 64, 1001, 4096)


def case(t: int, e: int, scale: float, hashed: bool, k: int = TOPK, vocab: int = VOCAB, ties: bool = False) -> dict:
    """A case; `ties` only where drawn (the other cases keep their ids)."""
    params = {"t": t, "e": e, "k": k, "scale": scale, "hashed": hashed, "vocab": vocab}
    return {**params, "ties": True} if ties else params


def production() -> list[dict]:
    return [case(t, e, s, h) for e, s in MODELS for h in (False, True) for t in TOKENS]


def extra_strategy() -> st.SearchStrategy[dict]:
    return st.builds(
        lambda t, e, k, h, ties: case(t, e, 1.5, h, min(k, e), vocab=1000, ties=ties and not h),
        tile_counts(8, 600), st.one_of(st.sampled_from([32, 64, 256, 384]), st.integers(1, 512)),
        st.integers(1, 8), st.booleans(), st.booleans(),
    )


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
