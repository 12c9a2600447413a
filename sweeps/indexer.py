"""Indexer case space (spec §6), two ops: the lightning-indexer logits and the top-k selection over them.

Logits: DSV4 Flash and Pro prefill (both models have 64 indexer heads of 128, so their logits shapes
are the same: the model label records which top-k follows, 512 / 1024), plus hypothesis draws of
ragged problems. Their params carry no `op` (they were recorded before top-k existed; an `op` would
change their case ids): a case without `op` is a logits case.

Params of one logits case:
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

Top-k (`op` = "topk"): the k largest of each row of fp32 logits [T, S_kv], -inf outside the row's
valid entries. Production: Flash k = 512 and Pro k = 1024 over prefill rows (T = S, S_kv = S/4, causal:
row t sees floor((t+1)/4) entries) for S in PREFILL_S, and decode batches (B rows, all ctx/4 entries
valid) for B in DECODE_B and ctx in DECODE_CTX. Params:
  k       entries selected per row (the output is [T, min(k, S_kv)])
  mask    causal (as above, p0 = 0), full (every entry valid), or ragged (row i sees its first lens[i])
  values  randn, bf16 (randn rounded to bf16: heavy ties at the threshold) or equal (one value per row)
Draws favour row lengths k - 1, k, k + 1, fewer valid than k, 512-entry steps +-1, one row, empty rows.

Decode (`op` = "decode"): B requests, one query token each, over a paged FP8 cache (64-key pages at
the ids of a block table, DeepGEMM's `fp8_paged_mqa_logits` layout: kernels/indexer/decode_glue.py);
logits [B, s_kv], -inf past each request's length. Production: Flash and Pro (the same 64 x 128
shape) at B in DECODE_B and ctx in DECODE_CTX, every request ctx / 4 entries (the largest, B = 128 at
1M tokens, is a 4.4 GB cache). Params:
  t       requests B
  s_kv    the output's width W (the largest length)
  mask    full (every request s_kv entries) or ragged (request i has lens[i] <= s_kv)
  table   shuffled (distinct pages in random order) or shared (random pages of a smaller pool:
          ids repeat within and across requests)
  pad     extra block-table entries a request (never read)
Draws favour lengths 0, 1, the 64-key page +-1, B off any tile (1..130), widths past the longest
length, and keep a case's keys under MAX_DRAWN_KEYS.

Select (`op` = "select"): the fused decode path, each request's top-k straight from the paged cache
(int32 [B, min(k, s_kv)]); decode's params and k, plus keys = "equal" (every key the same: all-equal
logits, which overflow the fused path's buffers past CAP keys and take its repair). Production: Flash
and Pro k at decode's B and ctx. Draws favour requests around CAP keys and around k, and a k past
CAP / 4 (the fused path's route to the unfused pair).

`extra(n, seed)` draws n cases of each op, interleaved: a sweep keeps the first n (`--examples n`:
half of each), `--op logits` the n logits draws, which are those the logits space alone drew before
top-k existed (the cases of committed runs), and `--op topk` those drawn before decode existed.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kernels.indexer.topk_glue import TOPK
from kernels.indexer.topk_select import CAP
from sweeps.common import draw, ragged_lengths, tile_counts

RATIO = 4  # tokens per compressed indexer entry
PREFILL_S = (4096, 16384)
MODELS = ("flash", "pro")
DECODE_B = (1, 32, 128)
DECODE_CTX = (8192, 65536, 262144, 1048576)  # tokens of context: ctx / 4 entries per row
TOPK_VALUES = ("randn", "bf16", "equal")
PAGE = 64  # keys per page of the paged decode cache
MAX_DRAWN_KEYS = 1 << 20  # keys of a drawn decode case (a 132 MiB cache)
REPORT_AXES = ("t", "s_kv")
REPORT_ROWS = "t"


def causal(t: int, s_kv: int, p0: int = 0, ties: bool = False, model: str = "drawn") -> dict:
    return {"model": model, "mask": "causal", "t": t, "s_kv": s_kv, "p0": p0, "ties": ties}


def varlen(lens, ties: bool = False) -> dict:
    lens = [int(n) for n in lens]
    return {"model": "drawn", "mask": "varlen", "t": sum(lens), "s_kv": sum(n // RATIO for n in lens),
            "lens": lens, "ties": ties}


def topk(t: int, s_kv: int, k: int, mask: str = "full", values: str = "randn", model: str = "drawn") -> dict:
    """A top-k case whose rows all see the same entries (full) or a causal prefix (causal)."""
    return {"op": "topk", "model": model, "k": k, "mask": mask, "t": t, "s_kv": s_kv, "values": values}


def ragged_topk(lens, s_kv: int, k: int, values: str = "randn") -> dict:
    """A top-k case of len(lens) rows, row i seeing its first lens[i] entries."""
    return {**topk(len(lens), s_kv, k, "ragged", values), "lens": [int(n) for n in lens]}


def is_topk(p) -> bool:
    """A top-k case's params (a case without `op` is a logits one)."""
    return p.get("op") == "topk"


def paged_decode(b: int, s_kv: int, lens=None, table: str = "shuffled", model: str = "drawn", pad: int = 0) -> dict:
    """A decode step of b requests over the paged cache, logits [b, s_kv]: every request s_kv entries
    (full) or request i lens[i] (ragged)."""
    p = {"op": "decode", "model": model, "mask": "full" if lens is None else "ragged", "t": b, "s_kv": s_kv,
         "table": table}
    if lens is not None:
        p["lens"] = [int(n) for n in lens]
    if pad:
        p["pad"] = pad
    return p


def is_decode(p) -> bool:
    return p.get("op") == "decode"


def paged_select(b: int, s_kv: int, k: int, lens=None, table: str = "shuffled", model: str = "drawn",
                 keys: str = "randn") -> dict:
    """A decode step's top-k straight from the paged cache (the fused path): paged_decode's params and
    k; keys "equal" makes every key of the cache the same (all-equal logits in every request)."""
    p = {**paged_decode(b, s_kv, lens, table, model), "op": "select", "k": k}
    if keys != "randn":
        p["keys"] = keys
    return p


def is_select(p) -> bool:
    return p.get("op") == "select"


def is_paged(p) -> bool:
    """A case over the paged cache: decode (logits) or select (their top-k)."""
    return p.get("op") in ("decode", "select")


def decode_lens(p: dict) -> list[int]:
    """A decode case's per-request lengths."""
    return p["lens"] if p["mask"] == "ragged" else [p["s_kv"]] * p["t"]


def production() -> list[dict]:
    logits = [causal(s, s // RATIO, 0, False, model) for model in MODELS for s in PREFILL_S]
    prefill = [topk(s, s // RATIO, TOPK[model], "causal", model=model) for model in MODELS for s in PREFILL_S]
    decode = [topk(b, ctx // RATIO, TOPK[model], model=model)
              for model in MODELS for b in DECODE_B for ctx in DECODE_CTX]
    paged = [paged_decode(b, ctx // RATIO, model=model) for model in MODELS for b in DECODE_B for ctx in DECODE_CTX]
    select = [paged_select(b, ctx // RATIO, TOPK[model], model=model)
              for model in MODELS for b in DECODE_B for ctx in DECODE_CTX]
    return logits + prefill + decode + paged + select


def visible_pairs(p: dict) -> int:
    """The (t, s) pairs inside the key ranges: the work the causal mask leaves (about T * S_kv / 2
    for a prefill; a decode step's summed lengths)."""
    if is_paged(p):
        return sum(min(n, p["s_kv"]) for n in decode_lens(p))
    if p["mask"] == "varlen":
        return sum(_prefix_sum(n) for n in p["lens"])
    t, s_kv, p0 = p["t"], p["s_kv"], p.get("p0", 0)
    return _prefix_sum(p0 + t, s_kv) - _prefix_sum(p0, s_kv)


def independent_logits(p: dict) -> int:
    """How many of the visible logits are independent: the visible pairs, or with `ties` (every key
    the same) one per row that sees any key."""
    if not p.get("ties", False):  # (decode draws have no ties)
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


def _row_length(k: int) -> st.SearchStrategy[int]:
    """A row's valid entries: around k, below it (none at all too), or past it up to 512-entry steps +-1."""
    return st.one_of(st.sampled_from([k - 1, k, k + 1]).filter(lambda n: n >= 0), st.integers(0, k),
                     tile_counts(512, max(1, 8 * k // 512)))


def _ragged(k: int, values: str) -> st.SearchStrategy[dict]:
    return st.builds(lambda lens, pad: ragged_topk(lens, max(lens) + pad, k, values),
                     st.lists(_row_length(k), min_size=1, max_size=16), st.sampled_from([0, 0, 1, 511]))


def _uniform(k: int, values: str) -> st.SearchStrategy[dict]:
    """Every row the same valid length: a decode batch (full; up to 4 rows of 262,144) or a prefill
    from position 0 (causal; up to T = 4k + 8, whose last rows see k - 1, k, k + 1 entries)."""
    full = st.builds(lambda s_kv, t: topk(t, s_kv, k, "full", values),
                     st.one_of(_row_length(k).filter(lambda n: n > 0), tile_counts(4096, 64)), st.integers(1, 4))
    prefill = st.builds(lambda t: topk(t, t // RATIO, k, "causal", values),
                        st.one_of(st.integers(4 * k - 4, 4 * k + 8), st.integers(1, 4 * k + 8)))
    return st.one_of(full, prefill)


def topk_strategy() -> st.SearchStrategy[dict]:
    """At most ~4.2M logits (16.8 MiB) a case: Pro's prefill rows at T = 4104."""
    k = st.sampled_from([TOPK["flash"], TOPK["pro"], TOPK["flash"], TOPK["pro"], 1, 100])
    values = st.sampled_from(("randn",) + TOPK_VALUES)
    return st.tuples(k, values).flatmap(lambda kv: st.one_of(_ragged(*kv), _uniform(*kv)))


def _request_length(cap: int) -> st.SearchStrategy[int]:
    """One request's keys (at most cap): none, one, a page +-1, whole pages, or ragged."""
    edges = st.sampled_from([0, 1, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE - 1, 2 * PAGE + 1])
    return st.one_of(edges, tile_counts(PAGE, 64), st.integers(0, 8192)).map(lambda n: min(n, cap))


def _decode_batch(b: int) -> st.SearchStrategy[dict]:
    cap = MAX_DRAWN_KEYS // b
    table = st.sampled_from(["shuffled", "shuffled", "shared"])
    pad = st.sampled_from([0, 0, 2])
    ragged = st.builds(lambda lens, extra, table, pad: paged_decode(b, max(1, max(lens) + extra), lens, table, pad=pad),
                       st.lists(_request_length(cap), min_size=b, max_size=b),
                       st.sampled_from([0, 0, 0, 1, PAGE - 1, PAGE]), table, pad)
    full = st.builds(lambda n, table: paged_decode(b, n, table=table), _request_length(cap).filter(lambda n: n > 0), table)
    return st.one_of(ragged, ragged, ragged, full)


def decode_strategy() -> st.SearchStrategy[dict]:
    """Decode steps of 1..130 requests (off every tile), at most MAX_DRAWN_KEYS keys a case."""
    b = st.one_of(st.sampled_from([1, 2, 3, 7, 31, 33, 65, 127, 129, 130]), st.integers(1, 130))
    return b.flatmap(_decode_batch)


def _select_batch(b: int, k: int) -> st.SearchStrategy[dict]:
    """Requests around the buffers' CAP keys (past it: the sampled bound and the repair), around k,
    and decode's lengths; some caches of one key repeated (every request overflows the buffers)."""
    cap = MAX_DRAWN_KEYS // b
    length = st.one_of(_request_length(cap), st.integers(min(CAP, cap), cap),
                       st.sampled_from([k - 1, k, k + 1, CAP, CAP + 1]).map(lambda n: max(0, min(n, cap))))
    table = st.sampled_from(["shuffled", "shuffled", "shared"])
    keys = st.sampled_from(["randn", "randn", "randn", "equal"])
    ragged = st.builds(lambda lens, extra, table, keys: paged_select(b, max(1, max(lens) + extra), k, lens, table,
                                                                     keys=keys),
                       st.lists(length, min_size=b, max_size=b), st.sampled_from([0, 0, 1, PAGE]), table, keys)
    full = st.builds(lambda n, keys: paged_select(b, n, k, keys=keys), length.filter(lambda n: n > 0), keys)
    return st.one_of(ragged, ragged, full)


def select_strategy() -> st.SearchStrategy[dict]:
    """Fused decode top-k steps of 1..130 requests, k of Flash, Pro, small ones and one past CAP / 4
    (the unfused route), at most MAX_DRAWN_KEYS keys a case."""
    b = st.one_of(st.sampled_from([1, 1, 2, 3, 7, 33, 129]), st.integers(1, 130))
    k = st.sampled_from([TOPK["flash"], TOPK["pro"], TOPK["flash"], TOPK["pro"], 1, 100, CAP // 4 + 1])
    return st.tuples(b, k).flatmap(lambda bk: _select_batch(*bk))


def extra(n: int, seed: int) -> list[dict]:
    spaces = [draw(extra_strategy(), n, seed), draw(topk_strategy(), n, seed), draw(decode_strategy(), n, seed),
              draw(select_strategy(), n, seed)]
    return [space[i] for i in range(max(map(len, spaces))) for space in spaces if i < len(space)]
