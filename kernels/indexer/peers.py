"""Peers of the indexer, each behind its own import: DeepGEMM's fp8_mqa_logits (the logits contract
our kernel implements; it has no top-k) and fp8_paged_mqa_logits (decode, on the same paged cache),
and torch (eager and compiled): for the logits the bf16
einsum + ReLU + weighted head sum on the dequantised operands, in row chunks (the [T, 64, S_kv]
intermediate of one call would be 8.6 GB at S = 16384); for top-k `torch.topk` put in our layout
(the production baseline: what a serving stack runs after the logits); for decode, per request:
gather its pages, dequantise them to bf16, then the same bf16 chunk function (all in the timed call).

The bf16 operands of the torch peer (the dequantised keys, q and w in bf16) are made once per input
buffer, out of the timed call (a bf16 deployment would keep them so).
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, import_reason
from kernels.common import Prepared
from kernels.indexer.decode_glue import PAGE, request_keys
from kernels.indexer.glue import HEADS, range_mask
from sweeps.indexer import is_decode, is_select, is_topk

TORCH_CHUNK_BYTES = 1 << 30  # the bf16 [rows, 64, S_kv] intermediate of one chunk


class DeepGemm(Impl):
    """deepseek-ai/DeepGEMM `fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke)` (clean_logits: -inf
    outside [ks, ke)); it returns a strided view of a padded [T, S_kv + 256] buffer it allocates."""

    family, name, backend = "indexer", "deepgemm", "deepgemm"
    archs = ("any",)

    def available(self) -> str | None:
        return import_reason("deep_gemm")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if is_topk(case.params):
            return ("DeepGEMM computes the indexer logits (fp8_mqa_logits), not their top-k "
                    "(the top-k peer is torch.topk)")
        return None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        import deep_gemm

        if is_decode(case.params):
            return {"logits": paged_logits(deep_gemm, **inputs, width=case["s_kv"])}
        if is_select(case.params):  # its logits, then torch.topk: what a serving stack runs
            return {"indices": topk_by_index(paged_logits(deep_gemm, **inputs, width=case["s_kv"]), case["k"])}
        logits = deep_gemm.fp8_mqa_logits(inputs["q"], (inputs["kv"], inputs["sc"]), inputs["w"],
                                          inputs["ks"], inputs["ke"])
        return {"logits": logits}


_SCHEDULE = Prepared()


def paged_logits(deep_gemm, q, kv_cache, w, lens, table, width: int) -> torch.Tensor:
    """DeepGEMM `fp8_paged_mqa_logits(q [B, 1, 64, 128], kv_cache, w, lens [B, 1], table, schedule, W)`
    on our inputs as they are (the same cache tensor). Its paged kernel takes only 2-D context lengths
    and no cleaning (`clean_logits` must be False: entries past a length are left unwritten), so the
    -inf past each length is one masked_fill in the call. Its schedule
    (`get_paged_mqa_logits_metadata(lens, 64, SMs)`, which a serving stack makes once a step for
    every layer) is made once per lens tensor, out of the timed call."""
    lens2 = lens.view(-1, 1)
    sched = _SCHEDULE.get((lens,), lambda: deep_gemm.get_paged_mqa_logits_metadata(lens2, PAGE,
                                                                                    deep_gemm.get_num_sms()))
    logits = deep_gemm.fp8_paged_mqa_logits(q.unsqueeze(1), kv_cache, w, lens2, table, sched, width, False)
    past = torch.arange(width, device=q.device) >= lens2
    return logits.masked_fill_(past, float("-inf"))


def bf16_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_h w[t, h] * ReLU(q[t, h] . k[s]) in bf16 for a chunk of rows (q [R, 64, 128], k [S_kv, 128],
    w [R, 64], all bf16) -> fp32 [R, S_kv], unmasked."""
    s = torch.einsum("thd,sd->ths", q, k).relu_()
    return (s * w.unsqueeze(-1)).sum(dim=1).float()


def topk_by_index(logits: torch.Tensor, k: int) -> torch.Tensor:
    """torch.topk's indices of each row's min(k, S) largest logits in our layout: ascending index
    order, then -1 for the picks that are -inf (a row with fewer than k valid entries); int32."""
    n = logits.shape[-1]
    values, idx = torch.topk(logits, min(k, n), dim=-1, sorted=False)
    idx = idx.masked_fill_(torch.isneginf(values), n).sort(dim=-1).values
    return idx.masked_fill_(idx == n, -1).to(torch.int32)


_BF16 = Prepared()


def _torch_decode(fn, q, kv_cache, w, lens, table, width: int) -> torch.Tensor:
    """Per request: its keys gathered from the pages and dequantised to bf16, then `fn` (bf16_logits)."""
    out = torch.full((q.shape[0], width), float("-inf"), device=q.device)
    for b, n in enumerate(lens.tolist()):
        n = max(0, min(n, width, PAGE * table.shape[1]))
        if n:
            kv, sc = request_keys(kv_cache, table, b, n)
            out[b, :n] = fn(q[b:b + 1].bfloat16(), (kv.float() * sc.unsqueeze(-1)).bfloat16(), w[b:b + 1].bfloat16())[0]
    return out


def _torch_call(fns: dict, case: Case, inputs: dict) -> dict:
    if is_topk(case.params):
        return {"indices": fns["topk"](inputs["logits"], case["k"])}
    fn = fns["logits"]
    if is_decode(case.params):
        return {"logits": _torch_decode(fn, **inputs, width=case["s_kv"])}
    if is_select(case.params):
        return {"indices": fns["topk"](_torch_decode(fn, **inputs, width=case["s_kv"]), case["k"])}
    q, kv, sc, w, ks, ke = (inputs[k] for k in ("q", "kv", "sc", "w", "ks", "ke"))
    qb, kb, wb = _BF16.get((q, kv, sc, w),
                           lambda: (q.bfloat16(), (kv.float() * sc.unsqueeze(-1)).bfloat16(), w.bfloat16()))
    n_tok, s_kv = q.shape[0], kv.shape[0]
    rows = max(1, TORCH_CHUNK_BYTES // max(1, HEADS * s_kv * 2))
    out = torch.empty(n_tok, s_kv, dtype=torch.float32, device=q.device)
    for a in range(0, n_tok, rows):
        b = min(a + rows, n_tok)
        out[a:b] = fn(qb[a:b], kb, wb[a:b])
    return {"logits": out.masked_fill_(~range_mask(ks, ke, s_kv), float("-inf"))}


def register_torch_peers() -> None:
    """torch (eager) and torch_compile of the bf16 chunk function (logits) and of topk_by_index."""
    from dsv4bench.core.torch_impls import register_torch_baselines

    register_torch_baselines("indexer", {"logits": bf16_logits, "topk": topk_by_index}, _torch_call)
