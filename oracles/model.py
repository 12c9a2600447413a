"""FP32 composition of the DSV4 forward pass (docs/model-math.md §3–§9), op by op through a table.

Every numerical op goes through `ops`, an object whose attributes are the ops of `ORACLE_OPS`
(`dsv4bench.model.dispatch.OpTable`), so a kernel can replace any one op and the rest stays FP32. Nothing here quantises activations: this
is the pure-FP32 oracle of the dataflow (no FP8/FP4 QAT simulation), with the checkpoint's
quantised weights dequantised exactly (§2.6).

One code path serves prefill, chunked prefill and decode: `forward` processes the S tokens at
positions start..start+S-1 on top of whatever the per-layer caches already hold. A cache object
(`dsv4bench.model.cache.LayerCache` in the runner) provides, per layer:

* `freqs`: the layer's RoPE frequencies (theta 10000 without YaRN for ratio 0, else 160000+YaRN);
* `window_keys(kv_new, pos) -> (kv_rows, indices [S, window])` and `push_window(kv_new, pos)`:
  the 128-slot ring of raw window KV (§10.1);
* `comp` / `idx_comp`: the main and indexer compressor states (`oracles.compressor.
  CompressorState`, set by the chunk at position 0); `comp_kv` / `idx_keys`: the compressed KV
  entries and the indexer keys emitted so far.

Shapes: one sequence, tokens first: streams X [S, hc, D], activations [S, D], all fp32.
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
from oracles.norm import rmsnorm
from oracles.projections import kv_projection, q_projection


def compressor_push(state: CompressorState, kv: torch.Tensor, score: torch.Tensor, t: int):
    """§5.7 decode step of a compressor: `state.push` (the reference's kv_state/score_state update);
    returns the raw entry [1, d] when token t completes a block, else None."""
    return state.push(kv, score, t)


# The op table: name -> (FP32 oracle, contract), in dataflow order. dsv4bench.model.dispatch
# builds on it; a kernel registered for an op must accept the oracle's arguments.
ORACLE_OPS = {
    "embed": (embed_streams, "embedding lookup copied into the hc streams (§3.1)"),
    "hc_pre": (hc_pre, "mHC collapse of the 4 streams into a sublayer input, with post/comb (§3.3)"),
    "rmsnorm": (rmsnorm, "RMSNorm over the last dim, optional weight: attn_norm, ffn_norm (§2.1)"),
    "q_projection": (q_projection, "wq_a → q_norm → wq_b → per-head norm → RoPE; also returns qr (§4)"),
    "kv_projection": (kv_projection, "wkv → kv_norm → RoPE, the shared K=V latent (§4)"),
    "compressor_project": (compressor_project, "compressor kv / score (+ape) projections (§5.2)"),
    "compressor_pool": (pool, "per-channel softmax pooling of block candidates, prefill (§5.3-5.4)"),
    "compressor_push": (compressor_push, "decode-time compressor state update and emission (§5.7)"),
    "compressor_post": (postprocess, "entry RMSNorm → RoPE at s·m → (indexer) Hadamard (§5.5)"),
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
    "sample": (sample, "temperature / Gumbel-max sampler (§9.3)"),
}


# ------------------------------------------------------------------------------------------------
# Composition
# ------------------------------------------------------------------------------------------------


def _compressor(p: dict, prefix: str, x: torch.Tensor, pos: torch.Tensor, cache, attr: str, ops, ratio: int,
                freqs: torch.Tensor, eps: float, indexer: bool) -> torch.Tensor:
    """Feed S new tokens to a compressor (§5); return the entries their blocks complete, [n_new, d].

    A chunk at position 0 is a prefill: pool every complete block and leave the reference's
    state (`CompressorState.after_prefill`) in `cache.<attr>`; later chunks push token by token.
    """
    kv, score = ops.compressor_project(x, p[f"{prefix}.wkv"], p[f"{prefix}.wgate"], p[f"{prefix}.ape"], pos)
    if int(pos[0]) == 0:
        raw = ops.compressor_pool(*block_candidates(kv[None], score[None], ratio))[0]
        state = CompressorState.after_prefill(kv[None], score[None], ratio)
        state.kv, state.score = state.kv.to(x.device), state.score.to(x.device)  # it builds on the CPU
        setattr(cache, attr, state)
        ids = torch.arange(raw.shape[0], device=x.device)
    else:
        state, rows, ids = getattr(cache, attr), [], []
        for i, t in enumerate(pos.tolist()):
            entry = ops.compressor_push(state, kv[i:i + 1], score[i:i + 1], t)
            if entry is not None:
                rows.append(entry[0])
                ids.append(t // ratio)
        if not rows:
            return kv.new_zeros(0, kv.shape[-1] // (2 if overlaps(ratio) else 1))
        raw, ids = torch.stack(rows), torch.tensor(ids, device=x.device)
    return ops.compressor_post(raw, p[f"{prefix}.norm"], ids, ratio, freqs, indexer=indexer, qat=False, eps=eps)


def _indexer(p: dict, x, qr, pos, cache, ops, cfg) -> torch.Tensor:
    """§6: the CSA top-k of compressed entries per query, [S, k] entry ids, -1 = none."""
    keys = _compressor(p, "attn.indexer.compressor", x, pos, cache, "idx_comp", ops, 4, cache.freqs,
                       cfg.norm_eps, indexer=True)
    cache.idx_keys = torch.cat([cache.idx_keys, keys])
    q = ops.indexer_queries(qr, p["attn.indexer.wq_b"], cfg.index_n_heads, pos, cache.freqs, qat=False)
    w = ops.indexer_weights(x, p["attn.indexer.weights_proj"], cfg.index_head_dim)
    scores = ops.indexer_scores(q[None], cache.idx_keys[None], w[None], pos)[0]
    return ops.indexer_topk(scores, cfg.index_topk)


def _hca_visible(pos: torch.Tensor, n: int, ratio: int) -> torch.Tensor:
    """HCA: query t uses every entry s < (t+1)//ratio, [S, n], -1 = not yet visible."""
    s = torch.arange(n, device=pos.device)[None, :]
    return torch.where(s < visible_entries(pos, ratio)[:, None], s, -1)


def attention(p: dict, x: torch.Tensor, pos: torch.Tensor, cache, ops, cfg, layer: int) -> torch.Tensor:
    """§4–§7: the attention sublayer for S new tokens. x [S, D] (after attn_norm) → [S, D]."""
    H, eps = cfg.n_heads, cfg.norm_eps
    ratio, freqs = cfg.ratio(layer), cache.freqs
    q, qr = ops.q_projection(x, p["attn.wq_a"], p["attn.q_norm"], p["attn.wq_b"], H, pos, freqs, eps)
    kv = ops.kv_projection(x, p["attn.wkv"], p["attn.kv_norm"], pos, freqs, eps, qat=False)

    kv_rows, idx = cache.window_keys(kv, pos)
    if ratio:
        entries = _compressor(p, "attn.compressor", x, pos, cache, "comp", ops, ratio, freqs, eps, indexer=False)
        cache.comp_kv = torch.cat([cache.comp_kv, entries])
        comp = _indexer(p, x, qr, pos, cache, ops, cfg) if ratio == 4 else \
            _hca_visible(pos, cache.comp_kv.shape[0], ratio)
        idx = torch.cat([torch.where(comp >= 0, comp + kv_rows.shape[0], -1), idx], dim=1)
        kv_rows = torch.cat([kv_rows, cache.comp_kv])
    cache.push_window(kv, pos)

    o, _ = ops.sparse_attention(q, kv_rows, idx, p["attn.attn_sink"], cfg.softmax_scale)
    return ops.output_projection(o, pos, freqs, p["attn.wo_a"], p["attn.wo_b"], cfg.o_groups)


def _expert(p: dict, name: str) -> ExpertWeights:
    return ExpertWeights(p[f"{name}.w1"], p[f"{name}.w2"], p[f"{name}.w3"])


def ffn(p: dict, x: torch.Tensor, ids: torch.Tensor, ops, cfg) -> torch.Tensor:
    """§8: routed experts (hash or biased routing) plus the shared expert. x [T, D] → [T, D]."""
    weights, idx = ops.router(x, p["ffn.gate"], cfg.n_activated_experts, cfg.route_scale,
                              p.get("ffn.gate.bias"), p.get("ffn.gate.tid2eid"), ids)
    experts = [_expert(p, f"ffn.experts.{e}") for e in range(cfg.n_routed_experts)]
    return ops.moe(x, weights, idx, experts, _expert(p, "ffn.shared_experts"), cfg.swiglu_limit)


def block(p: dict, X: torch.Tensor, pos, ids, cache, ops, cfg, layer: int) -> torch.Tensor:
    """§3.4: X [S, hc, D] → hc_pre → attn_norm → attention → hc_post → same with the MoE."""
    it, he, ne = cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps
    y, post, comb = ops.hc_pre(X, p["hc_attn_fn"], p["hc_attn_scale"], p["hc_attn_base"], it, he, ne)
    X = ops.hc_post(attention(p, ops.rmsnorm(y, p["attn_norm"], ne), pos, cache, ops, cfg, layer), X, post, comb)
    y, post, comb = ops.hc_pre(X, p["hc_ffn_fn"], p["hc_ffn_scale"], p["hc_ffn_base"], it, he, ne)
    return ops.hc_post(ffn(p, ops.rmsnorm(y, p["ffn_norm"], ne), ids, ops, cfg), X, post, comb)


def forward(top: dict, layers: list[dict], ids: torch.Tensor, start: int, caches: list, ops, cfg,
            all_logits: bool = False):
    """The main model on tokens ids [S] at positions start..start+S-1 (§3.1, blocks, §9.1).

    Returns (logits fp32 [S or 1, V] — every position or the last one, X fp32 [S, hc, D], the
    final residual streams before hc_head, which feed the MTP block).
    """
    pos = torch.arange(start, start + ids.shape[0], device=ids.device)
    X = ops.embed(ids, top["embed"], cfg.hc_mult).float()
    for i, (p, cache) in enumerate(zip(layers, caches)):
        X = block(p, X, pos, ids, cache, ops, cfg, i)
    sel = X if all_logits else X[-1:]
    logits = ops.lm_head(sel, top["hc_head_fn"], top["hc_head_scale"], top["hc_head_base"], top["norm"], top["head"],
                         cfg.norm_eps)
    return logits, X


def mtp_forward(top: dict, p: dict, X: torch.Tensor, next_ids: torch.Tensor, start: int, cache, ops, cfg,
                k: int = 0, all_logits: bool = False) -> torch.Tensor:
    """§9.2 MTP block k: main streams X [S, hc, D] at positions start.. and the ids of the tokens
    that follow them → draft logits fp32 [S or 1, V] for the token after those."""
    pos = torch.arange(start, start + next_ids.shape[0], device=next_ids.device)
    X0 = ops.mtp_input(X, next_ids, top["embed"], p["enorm"], p["hnorm"], p["e_proj"], p["h_proj"], cfg.norm_eps)
    X1 = block(p, X0, pos, next_ids, cache, ops, cfg, cfg.n_layers + k)
    sel = X1 if all_logits else X1[-1:]
    return ops.lm_head(sel, p["hc_head_fn"], p["hc_head_scale"], p["hc_head_base"], p["norm"], top["head"],
                       cfg.norm_eps)
