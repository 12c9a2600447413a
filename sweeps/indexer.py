"""Indexer (lightning-indexer logits) case space: DSV4 Flash and Pro prefill (spec §6; both models have
64 indexer heads of 128, so their logits shapes are the same: the model label records which top-k
follows, 512 / 1024), plus hypothesis draws of ragged problems.

Params of one case:
  t       query tokens T
  s_kv    compressed indexer entries (keys) S_kv
  mask    causal: one sequence, queries at positions p0 .. p0+T-1 see entries
                  s < min(floor((p+1)/4), S_kv) (ks = 0, ke = that bound);
          varlen: sequences of lengths `lens` packed along T (each a prefill from position 0),
                  their floor(len/4) entries packed along S_kv; query i of sequence b sees
                  [off_b, off_b + floor((i+1)/4)) (DeepGEMM's ks / ke form)
  p0      causal: the first query's position (0: a prefill; > 0: a later chunk, or the last T tokens
          of a longer context)
  lens    varlen: the sequence lengths
  ties    every key the same (all-equal logits along each row: what top-k must break)
  model   flash | pro (production) | drawn

Draws favour what hides bugs: S_kv < 64 (less than one consumer warpgroup's keys), S_kv and T at
tile boundaries +-1 (128 keys, 2 tokens per block), a single query, chunks at an offset whose last
query sees every entry, extra unfilled entries past the visible ones, ragged packed sequences
(some shorter than 4 tokens: no entry at all).
"""

from __future__ import annotations

from hypothesis import strategies as st

from sweeps.common import draw, ragged_lengths, tile_counts

RATIO = 4  # tokens per compressed indexer entry
PREFILL_S = (4096, 16384)
MODELS = ("flash", "pro")
REPORT_AXES = ("t", "s_kv")
REPORT_ROWS = "t"


def causal(t: int, s_kv: int, p0: int = 0, ties: bool = False, model: str = "drawn") -> dict:
    return {"model": model, "mask": "causal", "t": t, "s_kv": s_kv, "p0": p0, "ties": ties}


def varlen(lens, ties: bool = False) -> dict:
    lens = [int(n) for n in lens]
    return {"model": "drawn", "mask": "varlen", "t": sum(lens), "s_kv": sum(n // RATIO for n in lens),
            "lens": lens, "ties": ties}


def production() -> list[dict]:
    return [causal(s, s // RATIO, 0, False, model) for model in MODELS for s in PREFILL_S]


def visible_pairs(p: dict) -> int:
    """The (t, s) pairs inside the key ranges: the work the causal mask leaves (about T * S_kv / 2
    for a prefill)."""
    if p["mask"] == "varlen":
        return sum(_prefix_sum(n) for n in p["lens"])
    t, s_kv, p0 = p["t"], p["s_kv"], p.get("p0", 0)
    return _prefix_sum(p0 + t, s_kv) - _prefix_sum(p0, s_kv)


def independent_logits(p: dict) -> int:
    """How many of the visible logits are independent: the visible pairs, or with `ties` (every key
    the same) one per row that sees any key."""
    if not p.get("ties", False):
        return visible_pairs(p)
    if p["mask"] == "varlen":
        return sum(max(0, n - (RATIO - 1)) for n in p["lens"])
    if p["s_kv"] < 1:
        return 0
    return max(0, p["t"] - max(0, RATIO - 1 - p.get("p0", 0)))


def _prefix_sum(n: int, cap: int | None = None) -> int:
    """sum_{p < n} min(floor((p+1)/4), cap) in closed form."""
    def tri(m: int) -> int:  # sum_{p < m} floor((p+1)/4)
        q, r = divmod(m + 1, RATIO)  # values 0..q-1 four times each (minus p = -1's zero), then q r times
        return RATIO * q * (q - 1) // 2 + q * r
    if cap is None or n <= RATIO * cap:
        return tri(n)
    full = RATIO * cap  # from p = 4 cap - 1 on, floor((p+1)/4) >= cap
    return tri(full) + (n - full) * cap


def _end_aligned(t: int, s_kv: int, r: int, ties: bool) -> dict:
    """The last T queries of a context of 4 S_kv + r tokens (the last query sees every entry)."""
    return causal(t, s_kv, max(0, RATIO * s_kv + r - t), ties)


def extra_strategy() -> st.SearchStrategy[dict]:
    ties = st.sampled_from([False, False, False, False, True])
    end_aligned = st.builds(_end_aligned, tile_counts(2, 300), tile_counts(128, 12), st.integers(0, RATIO - 1), ties)
    prefill = st.builds(
        lambda t, extra, ties: causal(t, max(1, t // RATIO + extra), 0, ties),
        tile_counts(8, 200, lo=4), st.sampled_from([0, 0, 0, 1, 37, 128]), ties)
    packed = st.builds(varlen, ragged_lengths(8, 60, 5).filter(lambda ls: sum(n // RATIO for n in ls) > 0), ties)
    return st.one_of(end_aligned, end_aligned, prefill, packed)


def extra(n: int, seed: int) -> list[dict]:
    return draw(extra_strategy(), n, seed)
