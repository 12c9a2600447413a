"""The fmha family: gathered-key / dense attention with sink (spec §7), its inputs, oracle pairing,
cost model, CLI filters, and the implementations (ours, torch, FlashMLA, FA4, cuDNN). Cases with
`op: decode_fp8` are sparse decode over FlashMLA's paged FP8 caches (decode_family.py)."""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from kernels.fmha import decode_family as decode
from kernels.fmha import peers, variants
from kernels.fmha import serves as served
from kernels.fmha.glue import FmhaCuteDSL
from oracles.fmha import dense_attention, hca_compressed, sparse_attention
from sweeps import fmha as space


def scale_of(case: Case) -> float:
    return case["hd"] ** -0.5


def _distinct(gen: torch.Generator, rows: int, pool: int, k: int) -> torch.Tensor:
    """rows x k distinct integers in [0, pool) per row (-1 where pool < k)."""
    take = min(k, pool)
    pick = torch.rand(rows, pool, generator=gen).argsort(dim=1)[:, :take] if take else torch.zeros(rows, 0)
    pad = torch.full((rows, k - take), -1, dtype=torch.long)
    return torch.cat([pick.long(), pad], dim=1)


def sparse_indices(case: Case, gen: torch.Generator) -> torch.Tensor:
    """int32 [s_q, topk]: the §7.1 window slots (prefill encoding) plus the selected entries."""
    s_q, s_kv, topk, w = case["s_q"], case["s_kv"], case["topk"], case["window"]
    n_sel = topk - w
    if case["kv_layout"] == "per_token":  # decode: every request owns topk kv rows of the pool
        own = _distinct(gen, s_q, topk, topk) + torch.arange(s_q)[:, None] * topk
        sel = own
    elif case["select"] == "hca":
        sel = hca_compressed(s_q, 128).long()
        sel = torch.where(sel >= 0, sel + s_q, sel)
    elif case["select"] == "none":
        sel = torch.zeros(s_q, 0, dtype=torch.long)
    else:
        base = s_q if w else 0
        sel = _distinct(gen, s_q, s_kv - base, n_sel)
        sel = torch.where(sel >= 0, sel + base, sel)
    if case["invalid"] > 0 and sel.numel():
        drop = torch.rand(sel.shape, generator=gen) < case["invalid"]
        sel = torch.where(drop, torch.full_like(sel, -1), sel)
    parts = [sel[:, : topk - w]]
    if w:
        t = torch.arange(s_q)[:, None]
        win = t - (w - 1) + torch.arange(w)[None, :]
        parts.append(torch.where(win >= 0, win, torch.full_like(win, -1)))
    idx = torch.cat(parts, dim=1)
    assert idx.shape == (s_q, topk), (idx.shape, case)
    return idx.to(torch.int32)


def n_keys(case: Case) -> float:
    """Keys per query the FLOP convention counts: the index slots (sparse) or the masked-in keys."""
    if case["mask"] == "sparse":
        return float(case["topk"])
    s_q, s_kv, w = case["s_q"], case["s_kv"], case["window"] or None
    t = torch.arange(s_q, dtype=torch.float64) + (s_kv - s_q)
    hi = torch.clamp(t + 1, 0, s_kv) if "causal" in case["mask"] else torch.full_like(t, s_kv)
    if w is not None and case["mask"] in ("window", "causal_window"):
        lo = torch.clamp(t - (w - 1), 0, s_kv)
        if case["mask"] == "window":
            hi = torch.clamp(t + w, 0, s_kv)
    else:
        lo = torch.zeros_like(t)
    return float((hi - lo).clamp_min(0).mean())


class FmhaFamily(Family):
    name = "fmha"
    description = "attention with sink over gathered (DSV4 top-k/window/HCA) or dense masked keys, hd 64-512"
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/fmha/serves.py)
    options = {
        "hd": Option("hd", "head dim (d_qk = d_v)", "elements", tuple(space.HEAD_DIMS)),
        "heads": Option("h_q", "query heads", "heads"),
        "topk": Option("topk", "keys gathered per query (top-k / window list length)", "keys"),
        "sink": Option("sink", "with or without the per-head attention sink", flag=True),
        # "topk" is the CLI's name for the gathered (sparse) key lists
        "mask": Option("mask", "key selection", choices=tuple(space.MASKS), names=True, aliases={"topk": "sparse"}),
        "op": Option("op", "attention (bf16 keys), or decode_fp8 (one token a request over FlashMLA's paged FP8 "
                     "caches)", choices=("attention", "decode_fp8"), names=True, default="attention"),
        "requests": Option("b", "batch (decode: requests)", "requests"),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        if decode.is_decode(case):
            return decode.make_inputs(case, gen, device)
        b, s_q, s_kv, h_q, h_kv, d = (case[k] for k in ("b", "s_q", "s_kv", "h_q", "h_kv", "hd"))
        x = {
            "q": torch.randn(b, s_q, h_q, d, generator=gen),
            "k": torch.randn(b, s_kv, h_kv, d, generator=gen),
        }
        if not case["kv_shared"]:
            x["v"] = torch.randn(b, s_kv, h_kv, d, generator=gen)
        x = {k: v.to(torch.bfloat16) for k, v in x.items()}
        if case["sink"]:
            x["sink"] = torch.randn(h_q, generator=gen) * 2.0
        if case["mask"] == "sparse":
            x["idx"] = sparse_indices(case, gen)[None].expand(b, -1, -1).contiguous()
        return {k: v.to(device) for k, v in x.items()}

    def _attention(self, case: Case, x: dict, lowprec: bool) -> dict:
        if decode.is_decode(case):
            return decode.attention(case, x, lowprec)
        b, s_q, h_q, h_kv = case["b"], case["s_q"], case["h_q"], case["h_kv"]
        hpg = h_q // h_kv
        dt = torch.bfloat16 if lowprec else torch.float32
        out = torch.empty(b, s_q, h_q, case["hd"], dtype=dt, device=x["q"].device)
        lse = torch.empty(b, s_q, h_q, dtype=torch.float32, device=x["q"].device)
        mask = case["mask"]
        for bi in range(b):
            for g in range(h_kv):
                hs = slice(g * hpg, (g + 1) * hpg)
                q, k = x["q"][bi, :, hs], x["k"][bi, :, g]
                v = x["v"][bi, :, g] if "v" in x else k
                sink = x["sink"][hs] if "sink" in x else None
                if mask == "sparse":
                    o, l = sparse_attention(q, k, x["idx"][bi], sink, scale_of(case), v, lowprec=lowprec)
                else:
                    window = case["window"] if "window" in mask else None
                    o, l = dense_attention(q, k, v, sink, scale_of(case), "causal" in mask, window, lowprec)
                out[bi, :, hs], lse[bi, :, hs] = o, l
        return {"out": out, "lse": lse} if case["lse"] else {"out": out}

    def oracle(self, case: Case, inputs: dict) -> dict:
        return self._attention(case, inputs, lowprec=False)

    def lowprec(self, case: Case, inputs: dict) -> dict:
        return self._attention(case, inputs, lowprec=True)

    def alloc_outputs(self, case: Case, device: str) -> dict:
        if decode.is_decode(case):
            return decode.alloc_outputs(case, device)
        b, s_q, h_q, d = case["b"], case["s_q"], case["h_q"], case["hd"]
        return {
            "out": torch.empty(b, s_q, h_q, d, dtype=torch.bfloat16, device=device),
            "lse": torch.empty(b, s_q, h_q, dtype=torch.float32, device=device),
        }

    def cost(self, case: Case) -> Cost:
        if decode.is_decode(case):
            return decode.cost(case)
        b, s_q, s_kv, h_q, h_kv, d = (case[k] for k in ("b", "s_q", "s_kv", "h_q", "h_kv", "hd"))
        flops = 4.0 * b * s_q * h_q * n_keys(case) * d
        qo = 2.0 * b * s_q * h_q * d * 2 + 4.0 * b * s_q * h_q
        kv_mats = 1 if case["kv_shared"] else 2
        if case["mask"] == "sparse":
            rows = s_q * case["topk"] if case["kv_layout"] == "per_token" else min(s_kv, s_q * case["topk"])
            kv = kv_mats * rows * d * 2.0 + 4.0 * s_q * case["topk"]
        else:
            kv = kv_mats * b * s_kv * h_kv * d * 2.0
        return Cost(flops=flops, bytes=qo + kv)


class FmhaTorch(Impl):
    """The low-precision reference composed in torch (bf16 matmuls, fp32 softmax), on the GPU."""

    family, name, backend = "fmha", "torch", "torch"
    archs = ("any",)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        return FAMILY.lowprec(case, inputs)


FAMILY = register_family(FmhaFamily())
for _impl in (FmhaCuteDSL(), FmhaTorch(), peers.FlashMLA(), peers.FA4(), peers.CudnnSDPA()):
    register_impl(_impl)
for _variant in variants.VARIANTS + variants.PREFILL_VARIANTS + variants.DECODE_VARIANTS:  # run only when --impl names them
    register_impl(_variant())
