"""FP32 composition of the DSV4 forward pass (docs/model-math.md §3–§9), op by op through a table.

Every numerical op goes through `ops`, an object whose attributes are the ops of `ORACLE_OPS`
(`dsv4bench.model.dispatch.OpTable`), so a kernel can replace any one op and the rest stays FP32;
`ops.enter(scope)` names the part of the model that runs next ("embed", "layer 3 attn", "layer 3
ffn", "head", "mtp.0", "mtp.0 attn", ...), which a diff of two backends uses to attribute errors. Weights are the checkpoint's
quantised ones dequantised exactly (§2.6). `qat` switches the official model's quantisation-aware
round trips (§2.3/§2.4): FP8 qdq of the window and compressed KV NoPE dims, FP4 qdq of the
Hadamard-rotated indexer queries and keys; with `qat=False` the model is pure FP32 (§12.2).

One code path serves prefill, chunked prefill and decode: `forward` processes the S tokens at
positions start..start+S-1 of B sequences on top of whatever the per-layer caches already hold.
Every sequence of a batch is at the same positions (the official generate loop's left-aligned
batch). A cache object (`dsv4bench.model.cache.LayerCache` in the runner) provides, per layer:

* `freqs`: the layer's RoPE frequencies (theta 10000 without YaRN for ratio 0, else 160000+YaRN);
* `seen` and `check_start(start)`: the tokens it holds (a chunk starts there; positions are read on
  the host from `seen`, never from the device tensor `pos`, whose read would stall the launches);
* `window_keys(kv_new, pos) -> (kv_rows [B, R, d], indices [S, window])` and
  `push_window(kv_new, pos)`: the 128-slot ring of raw window KV per sequence (§10.1);
* `comp` / `idx_comp`: the main and indexer compressor states (`oracles.compressor.
  CompressorState`, set by the chunk at position 0); `comp_kv` / `idx_keys` [B, n, d]: the
  compressed KV entries and the indexer keys emitted so far.

Shapes: token-wise ops see the B·S tokens flattened, sequence-major (streams [B·S, hc, D],
activations [B·S, D], all fp32), so a batch of one passes the ops exactly the single-sequence
shapes; the caches, the compressor, the indexer scores and the attention key sets keep B apart.
"""

from __future__ import annotations

import torch

from oracles.attention import output_projection
from oracles.compressor import (
    CompressorState,
    block_candidates,
    compressor_project,
    overlaps,
    pool,
    postprocess,
    visible_entries,
)
from oracles.fmha import sparse_attention
from oracles.head import lm_logits, mtp_input, sample
from oracles.indexer import indexer_queries, indexer_scores, indexer_topk, indexer_weights
from oracles.mhc import embed_streams, hc_post, hc_pre
from oracles.moe import ExpertWeights, moe, route
from oracles.norm import NORM_EPS, rmsnorm
from oracles.projections import kv_projection, q_projection


def compressor_prefill(kv: torch.Tensor, score: torch.Tensor, norm_weight: torch.Tensor, m: int, freqs: torch.Tensor,
                       indexer: bool = False, qat: bool = True, eps: float = NORM_EPS) -> torch.Tensor:
    """§5.3-§5.5 of a prefill from position 0, pooling and post-processing in one op (the compressor
    kernel fuses them): projections kv, score [B, S, coff·d] → the ⌊S/m⌋ entries [B, n, d]."""
    raw = pool(*block_candidates(kv, score, m))
    ids = torch.arange(raw.shape[1], device=raw.device).repeat(raw.shape[0])
    out = postprocess(raw.flatten(0, 1), norm_weight, ids, m, freqs, indexer=indexer, qat=qat, eps=eps)
    return out.unflatten(0, raw.shape[:2])


def compressor_push(state: CompressorState, kv: torch.Tensor, score: torch.Tensor, t: int):
    """§5.7 decode step of a compressor: `state.push` (the reference's kv_state/score_state update);
    returns the raw entry [1, d] when token t completes a block, else None."""
    return state.push(kv, score, t)


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None):
    """§9.3 on logits of any device: the noise comes from a CPU generator (a seed gives the same
    tokens on any device), so the oracle samples on the CPU."""
    return sample(logits.float().cpu(), temperature, generator)


# The op table: name -> (FP32 oracle, contract), in dataflow order. dsv4bench.model.dispatch
# builds on it; a kernel registered for an op must accept the oracle's arguments.
ORACLE_OPS = {
    "embed": (embed_streams, "embedding lookup copied into the hc streams (§3.1)"),
    "hc_pre": (hc_pre, "mHC collapse of the 4 streams into a sublayer input, with post/comb (§3.3)"),
    "rmsnorm": (rmsnorm, "RMSNorm over the last dim, optional weight: attn_norm, ffn_norm (§2.1)"),
    "q_projection": (q_projection, "wq_a → q_norm → wq_b → per-head norm → RoPE; also returns qr (§4)"),
    "kv_projection": (kv_projection, "wkv → kv_norm → RoPE, the shared K=V latent (§4)"),
    "compressor_project": (compressor_project, "compressor kv / score (+ape) projections (§5.2)"),
    "compressor_prefill": (compressor_prefill, "prefill: softmax pooling of every complete block, then the "
                                               "entry post-processing (§5.3-5.5)"),
    "compressor_push": (compressor_push, "decode-time compressor state update and emission (§5.7)"),
    "compressor_post": (postprocess, "decode entry RMSNorm → RoPE at s·m → (indexer) Hadamard (§5.5)"),
    "indexer_queries": (indexer_queries, "indexer q: wq_b(qr) → RoPE → Hadamard (§6)"),
    "indexer_weights": (indexer_weights, "indexer per-head weights weights_proj(x)·d^-0.5·H^-0.5 (§6)"),
    "indexer_scores": (indexer_scores, "indexer scores sum_h w·ReLU(q·k), causally masked (§6)"),
    "indexer_topk": (indexer_topk, "top-k compressed entries per query, -1 = none (§6)"),
    "sparse_attention": (sparse_attention, "gathered-key attention with per-head sink (§7.2)"),
    "output_projection": (output_projection, "inverse RoPE, grouped wo_a, wo_b (§7.3-7.4)"),
    "hc_post": (hc_post, "mHC expansion + residual mixing (§3.4)"),
    "router": (route, "sqrt-softplus router, hash (tid2eid) or biased top-k (§8.1)"),
    "moe": (moe, "routed clamped-SwiGLU experts + shared expert, combined (§8.2-8.3)"),
    "mtp_input": (mtp_input, "MTP input: e_proj(enorm(embed(next))) + h_proj(hnorm(X)) (§9.2)"),
    "lm_head": (lm_logits, "hc_head → norm → head logits (§9.1)"),
    "sample": (sample_tokens, "temperature / Gumbel-max sampler, CPU-drawn noise (§9.3)"),
}


# ------------------------------------------------------------------------------------------------
# Composition
# ------------------------------------------------------------------------------------------------


def _compressor(p: dict, prefix: str, x: torch.Tensor, pos: torch.Tensor, start: int, cache, attr: str, ops,
                ratio: int, eps: float, indexer: bool, qat: bool) -> torch.Tensor:
    """Feed S new tokens of B sequences (x [B·S, D]) to a compressor (§5); return the entries
    their blocks complete, [B, n_new, d]. pos [S] = start..start+S-1 on the device; `start` is its
    host copy (a device read would stall the host's queue of launches).

    A chunk at position 0 is a prefill: pool every complete block and leave the reference's
    state (`CompressorState.after_prefill`) in `cache.<attr>`; later chunks push token by token.
    """
    batch = x.shape[0] // pos.shape[0]
    kv, score = ops.compressor_project(x, p[f"{prefix}.wkv"], p[f"{prefix}.wgate"], p[f"{prefix}.ape"],
                                       pos.repeat(batch))
    kv, score = kv.unflatten(0, (batch, -1)), score.unflatten(0, (batch, -1))
    norm = p[f"{prefix}.norm"]
    if start == 0:
        state = CompressorState.after_prefill(kv, score, ratio)
        state.kv, state.score = state.kv.to(x.device), state.score.to(x.device)  # it builds on the CPU
        setattr(cache, attr, state)
        return ops.compressor_prefill(kv, score, norm, ratio, cache.freqs, indexer=indexer, qat=qat, eps=eps)
    state, rows, ids = getattr(cache, attr), [], []
    for i, t in enumerate(range(start, start + pos.shape[0])):
        entry = ops.compressor_push(state, kv[:, i], score[:, i], t)
        if entry is not None:
            rows.append(entry)
            ids.append(t // ratio)
    if not rows:
        return kv.new_zeros(batch, 0, kv.shape[-1] // (2 if overlaps(ratio) else 1))
    raw, ids = torch.stack(rows, dim=1), torch.tensor(ids, device=x.device)
    out = ops.compressor_post(raw.flatten(0, 1), norm, ids.repeat(batch), ratio, cache.freqs,
                              indexer=indexer, qat=qat, eps=eps)
    return out.unflatten(0, (batch, -1))


def _indexer(p: dict, x, qr, pos, start: int, cache, ops, cfg, qat: bool) -> torch.Tensor:
    """§6: the CSA top-k of compressed entries per query, [B, S, k] entry ids, -1 = none."""
    batch = x.shape[0] // pos.shape[0]
    keys = _compressor(p, "attn.indexer.compressor", x, pos, start, cache, "idx_comp", ops, 4, cfg.norm_eps,
                       indexer=True, qat=qat)
    cache.idx_keys = torch.cat([cache.idx_keys, keys], dim=1)
    q = ops.indexer_queries(qr, p["attn.indexer.wq_b"], cfg.index_n_heads, pos.repeat(batch), cache.freqs, qat=qat)
    w = ops.indexer_weights(x, p["attn.indexer.weights_proj"], cfg.index_head_dim)
    scores = ops.indexer_scores(q.unflatten(0, (batch, -1)), cache.idx_keys, w.unflatten(0, (batch, -1)), pos)
    return ops.indexer_topk(scores, cfg.index_topk)


def _hca_visible(pos: torch.Tensor, n: int, ratio: int) -> torch.Tensor:
    """HCA: query t uses every entry s < (t+1)//ratio, [S, n], -1 = not yet visible."""
    s = torch.arange(n, device=pos.device)[None, :]
    return torch.where(s < visible_entries(pos, ratio)[:, None], s, -1)


def _one_pool(kv_rows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence key rows [B, R, d] and indices [B, S, n] → one gather pool [B·R, d] with
    indices [B·S, n] into it (sequence b's rows at b·R..), -1 kept."""
    batch, rows = kv_rows.shape[:2]
    offset = (torch.arange(batch, device=idx.device) * rows)[:, None, None]
    return kv_rows.flatten(0, 1), torch.where(idx >= 0, idx + offset, -1).flatten(0, 1)


def attention(p: dict, x: torch.Tensor, pos: torch.Tensor, cache, ops, cfg, layer: int, qat: bool) -> torch.Tensor:
    """§4–§7: the attention sublayer for S new tokens of B sequences. x [B·S, D] (after attn_norm) → [B·S, D]."""
    H, eps = cfg.n_heads, cfg.norm_eps
    ratio, freqs, batch = cfg.ratio(layer), cache.freqs, x.shape[0] // pos.shape[0]
    pos_t = pos.repeat(batch)
    q, qr = ops.q_projection(x, p["attn.wq_a"], p["attn.q_norm"], p["attn.wq_b"], H, pos_t, freqs, eps)
    kv = ops.kv_projection(x, p["attn.wkv"], p["attn.kv_norm"], pos_t, freqs, eps, qat=qat).unflatten(0, (batch, -1))

    start = cache.seen  # pos[0], known on the host (forward checked it)
    kv_rows, win = cache.window_keys(kv, pos)
    idx = win.expand(batch, -1, -1)
    if ratio:
        entries = _compressor(p, "attn.compressor", x, pos, start, cache, "comp", ops, ratio, eps, indexer=False,
                              qat=qat)
        cache.comp_kv = torch.cat([cache.comp_kv, entries], dim=1)
        comp = _indexer(p, x, qr, pos, start, cache, ops, cfg, qat) if ratio == 4 else \
            _hca_visible(pos, cache.comp_kv.shape[1], ratio).expand(batch, -1, -1)
        idx = torch.cat([torch.where(comp >= 0, comp + kv_rows.shape[1], -1), idx], dim=2)
        kv_rows = torch.cat([kv_rows, cache.comp_kv], dim=1)
    cache.push_window(kv, pos)

    o, _ = ops.sparse_attention(q, *_one_pool(kv_rows, idx), p["attn.attn_sink"], cfg.softmax_scale)
    return ops.output_projection(o, pos_t, freqs, p["attn.wo_a"], p["attn.wo_b"], cfg.o_groups)


def _expert(p: dict, name: str) -> ExpertWeights:
    return ExpertWeights(p[f"{name}.w1"], p[f"{name}.w2"], p[f"{name}.w3"])


def ffn(p: dict, x: torch.Tensor, ids: torch.Tensor, ops, cfg) -> torch.Tensor:
    """§8: routed experts (hash or biased routing) plus the shared expert. x [T, D] → [T, D]."""
    weights, idx = ops.router(x, p["ffn.gate"], cfg.n_activated_experts, cfg.route_scale,
                              p.get("ffn.gate.bias"), p.get("ffn.gate.tid2eid"), ids)
    experts = [_expert(p, f"ffn.experts.{e}") for e in range(cfg.n_routed_experts)]
    return ops.moe(x, weights, idx, experts, _expert(p, "ffn.shared_experts"), cfg.swiglu_limit)


def block(p: dict, X: torch.Tensor, pos, ids, cache, ops, cfg, layer: int, qat: bool, scope: str) -> torch.Tensor:
    """§3.4: X [B·S, hc, D] → hc_pre → attn_norm → attention → hc_post → same with the MoE.
    ids [B·S]; pos [S] the positions every sequence is at; scope: "layer i" or "mtp.k"."""
    it, he, ne = cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps
    ops.enter(f"{scope} attn")
    y, post, comb = ops.hc_pre(X, p["hc_attn_fn"], p["hc_attn_scale"], p["hc_attn_base"], it, he, ne)
    o = attention(p, ops.rmsnorm(y, p["attn_norm"], ne), pos, cache, ops, cfg, layer, qat)
    X = ops.hc_post(o, X, post, comb)
    ops.enter(f"{scope} ffn")
    y, post, comb = ops.hc_pre(X, p["hc_ffn_fn"], p["hc_ffn_scale"], p["hc_ffn_base"], it, he, ne)
    return ops.hc_post(ffn(p, ops.rmsnorm(y, p["ffn_norm"], ne), ids, ops, cfg), X, post, comb)


def _head(ops, X: torch.Tensor, batch: int, p: dict, head_weight: torch.Tensor, cfg, all_logits: bool):
    """Logits [B, S or 1, V] of the streams X [B·S, hc, D] (every position or each sequence's last)."""
    sel = X if all_logits else X.unflatten(0, (batch, -1))[:, -1]
    logits = ops.lm_head(sel, p["hc_head_fn"], p["hc_head_scale"], p["hc_head_base"], p["norm"], head_weight,
                         cfg.norm_eps)
    return logits.unflatten(0, (batch, -1))


def forward(top: dict, layers: list[dict], ids: torch.Tensor, start: int, caches: list, ops, cfg, qat: bool,
            all_logits: bool = False):
    """The main model on tokens ids [B, S] at positions start..start+S-1 (§3.1, blocks, §9.1).

    Returns (logits fp32 [B, S or 1, V] — every position or the last one, X fp32 [B, S, hc, D],
    the final residual streams before hc_head, which feed the MTP block).
    """
    batch, seqlen = ids.shape
    for cache in caches:
        cache.check_start(start)
    pos = torch.arange(start, start + seqlen, device=ids.device)
    flat = ids.reshape(-1)
    ops.enter("embed")
    X = ops.embed(flat, top["embed"], cfg.hc_mult).to(ops.stream_dtype)  # fp32; bf16 in the lowprec model
    for i, (p, cache) in enumerate(zip(layers, caches)):
        X = block(p, X, pos, flat, cache, ops, cfg, i, qat, f"layer {i}")
    ops.enter("head")
    return _head(ops, X, batch, top, top["head"], cfg, all_logits), X.unflatten(0, (batch, seqlen))


def mtp_forward(top: dict, p: dict, X: torch.Tensor, next_ids: torch.Tensor, start: int, cache, ops, cfg, qat: bool,
                k: int = 0, all_logits: bool = False) -> torch.Tensor:
    """§9.2 MTP block k: main streams X [B, S, hc, D] at positions start.. and the ids [B, S] of
    the tokens that follow them → draft logits fp32 [B, S or 1, V] for the token after those."""
    batch, seqlen = next_ids.shape
    cache.check_start(start)
    pos = torch.arange(start, start + seqlen, device=next_ids.device)
    flat = next_ids.reshape(-1)
    ops.enter(f"mtp.{k}")
    X0 = ops.mtp_input(X.flatten(0, 1), flat, top["embed"], p["enorm"], p["hnorm"], p["e_proj"], p["h_proj"],
                       cfg.norm_eps)
    X1 = block(p, X0, pos, flat, cache, ops, cfg, cfg.n_layers + k, qat, f"mtp.{k}")
    ops.enter(f"mtp.{k} head")
    return _head(ops, X1, batch, p, top["head"], cfg, all_logits)
