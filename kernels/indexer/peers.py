"""Peers of the indexer logits, each behind its own import: DeepGEMM's fp8_mqa_logits (the contract
our kernel implements) and torch (eager and compiled): the bf16 einsum + ReLU + weighted head sum
on the dequantised operands, in row chunks (the [T, 64, S_kv] intermediate of one call would be
8.6 GB at S = 16384).

The bf16 operands of the torch peer (the dequantised keys, q and w in bf16) are made once per input
buffer, out of the timed call (a bf16 deployment would keep them so).
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, import_reason
from kernels.common import Prepared
from kernels.indexer.glue import HEADS, range_mask

TORCH_CHUNK_BYTES = 1 << 30  # the bf16 [rows, 64, S_kv] intermediate of one chunk


class DeepGemm(Impl):
    """deepseek-ai/DeepGEMM `fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke)` (clean_logits: -inf
    outside [ks, ke)); it returns a strided view of a padded [T, S_kv + 256] buffer it allocates."""

    family, name, backend = "indexer", "deepgemm", "deepgemm"
    archs = ("any",)

    def available(self) -> str | None:
        return import_reason("deep_gemm")

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        import deep_gemm

        logits = deep_gemm.fp8_mqa_logits(inputs["q"], (inputs["kv"], inputs["sc"]), inputs["w"],
                                          inputs["ks"], inputs["ke"])
        return {"logits": logits}


def bf16_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_h w[t, h] * ReLU(q[t, h] . k[s]) in bf16 for a chunk of rows (q [R, 64, 128], k [S_kv, 128],
    w [R, 64], all bf16) -> fp32 [R, S_kv], unmasked."""
    s = torch.einsum("thd,sd->ths", q, k).relu_()
    return (s * w.unsqueeze(-1)).sum(dim=1).float()


_BF16 = Prepared()


def _torch_call(fn, case: Case, inputs: dict) -> dict:
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
    """torch (eager) and torch_compile of the bf16 chunk function."""
    from dsv4bench.core.torch_impls import register_torch_baselines

    register_torch_baselines("indexer", bf16_logits, _torch_call)
