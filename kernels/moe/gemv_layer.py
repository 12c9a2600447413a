"""Glue of the GEMV decode path (kernels/moe/gemv_sm90.py; variant `cutedsl:gemv`): compiles, the views the
kernels take of the dispatch buffers and of the checkpoint's weights, and the layer op

    dispatch (masked, padding rows skipped) -> GEMV L1 (w1 | w3 + SwiGLU x route weight -> bf16 h)
    -> GEMV L2 (FP8(h) per 128, w2 -> bf16 rows) -> combine

The weights are read as the checkpoint stores them (no load-time layout): w1 / w3 [E, I, D/2], w2
[E, D, I/2] as int32 words, their e8m0 scales as bytes. `tmax` (compile-time) is the tokens of one
expert the registers hold at a time: an expert with more is run in chunks of tmax (its unit's weight
rows read again per chunk), so any count is right and a count above tmax is only slower. Counts above
max_m (the masked layout's rows) are the dispatch's to refuse: `run_gemv_layer(check=True)` reads them
back (a host sync) and raises a ValueError.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from kernels.common import compile_kernel, sm_count
from kernels.moe.glue import check_dispatch, compile_combine, compile_dispatch, dispatch_args, planned
from kernels.gemm.config import H100_SMS
from kernels.moe.gemv_sm90 import K_ALIGN, PAIRS, QBLOCK, TMAXES, GemvConfig, gemv_kernel
from kernels.moe.grouped_config import MAX_GROUPS

REG_FILE = 65536


def pick_tmax(worst: int) -> int:
    """The smallest compiled tmax that holds `worst` tokens an expert in one chunk (the largest past 4)."""
    return next((t for t in TMAXES if worst <= t), max(TMAXES))


def refusal(d: int, i: int) -> str | None:
    """Why the GEMV path cannot run a layer of these widths, or None."""
    if d % K_ALIGN or i % K_ALIGN:
        return f"D={d} and I={i} must be multiples of {K_ALIGN} (the GEMV's CTA: 32-wide chunks in whole warps)"
    if i % PAIRS or d % (2 * PAIRS):
        return f"I={i} must be a multiple of {PAIRS} and D={d} of {2 * PAIRS} (the GEMV's work units)"
    return None


def gemv_config(stage: str, d: int, i: int, tmax: int, topk: int | None = None) -> GemvConfig:
    """L1 (N = I, K = D) or L2 (N = D, K = I) with the launch bound that leaves ~32·tmax + 96 registers a
    thread (the activations, the rows in flight, the decode), at most 8 CTAs an SM; with `topk`, units
    of pick_pairs' size (else 16 row pairs)."""
    n, k = (i, d) if stage == "l1" else (d, i)
    threads = k // 32
    need = 32 * tmax + (128 if tmax == 4 else 96)  # tmax 4: 96 spilled at Pro L2 (3 CTAs of 96 threads)
    min_ctas = max(1, min(8, REG_FILE // (threads * need)))
    pairs = PAIRS if topk is None else pick_pairs(n if stage == "l1" else n // 2, topk, H100_SMS * min_ctas, tmax,
                                                  threads)
    return GemvConfig(stage, n, k, tmax, min_ctas=min_ctas, pairs=pairs)


def unit_balance(units: int, slots: int) -> float:
    """Busy share of the CTA slots (CTAs an SM x SMs) when `units` are handed out in contiguous ranges of
    ceil(units / slots): the slowest CTA sets the time."""
    return units / (-(-units // slots) * slots) if units else 0.0


def pick_pairs(row_pairs: int, topk: int, slots: int, tmax: int, threads: int) -> int:
    """Row pairs a unit, for a layer whose fewest active experts (one token: `topk`) give the fewest units:
    the largest of 16 / 8 / 4 whose contiguous ranges keep >= 85% of the slots busy, else the best
    balanced (smaller units pay a pipeline fill and a barrier each: prefer large ones when balance ties).
    Flash (H100): L1 768 units of 16 over 528 slots is 73% busy, 1536 of 8 97%; Pro L1 1152 / 264 87%."""
    fits = [p for p in (PAIRS, 8, 4) if row_pairs % p == 0 and p * tmax <= threads]
    score = {p: unit_balance(topk * row_pairs // p, slots) for p in fits}
    good = [p for p in fits if score[p] >= 0.85]
    return good[0] if good else max(fits, key=lambda p: (round(score[p], 2), p))


def _sym64():
    return cute.sym_int64(divisibility=1)


def fake_gemv(cfg: GemvConfig) -> tuple:
    rows, wrows, g, mg = cute.sym_int32(), cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    f32, u8, i32 = cutlass.Float32, cutlass.Uint8, cutlass.Int32
    k = cfg.k
    if cfg.stage == "l1":
        x = make_fake_tensor(i32, (rows, k // 4), (k // 4, 1), assumed_align=16)
        xs = make_fake_tensor(f32, (mg, k // QBLOCK, g), (1, _sym64(), _sym64()), assumed_align=4)
        out = make_fake_tensor(i32, (rows, cfg.n // 2), (cfg.n // 2, 1), assumed_align=16)
    else:
        x = make_fake_tensor(i32, (rows, k // 2), (k // 2, 1), assumed_align=16)
        xs = make_fake_tensor(f32, (1, 1, 1), (1, 1, 1), assumed_align=4)
        out = make_fake_tensor(i32, (rows, cfg.n // 2), (cfg.n // 2, 1), assumed_align=16)
    w = make_fake_tensor(i32, (wrows, k // 8), (k // 8, 1), assumed_align=16)
    s = make_fake_tensor(u8, (wrows, k // 32), (k // 32, 1), assumed_align=4)
    counts = make_fake_tensor(i32, (cute.sym_int32(),), (1,), assumed_align=4)
    row_w = make_fake_tensor(f32, (rows,), (1,), assumed_align=4)
    return x, xs, w, s, w, s, counts, row_w, out, cutlass.Int32(16), cutlass.Int32(132)


def compile_gemv(stage: str, d: int, i: int, tmax: int, arch: str = "sm_90a", topk: int | None = None):
    cfg = gemv_config(stage, d, i, tmax, topk)
    return compile_kernel(gemv_kernel(cfg), *fake_gemv(cfg), arch=arch)


class CompiledGemvLayer:
    """The four compiles of the GEMV layer (dispatch, l1, l2, combine; `kernels` as CompiledLayer's)."""

    frame = "checkpoint"

    def __init__(self, kernels: dict, tmax: int, configs: dict):
        self.kernels, self.tmax, self.configs = kernels, tmax, configs


def compile_gemv_layer(n_experts: int, topk: int, d: int, i: int, tmax: int, arch: str = "sm_90a",
                       balance: bool = False) -> CompiledGemvLayer:
    """`balance`: units sized by pick_pairs for the layer's one-token case (else 16 row pairs)."""
    why = refusal(d, i)
    if why or tmax not in TMAXES:
        raise ValueError(why or f"tmax must be one of {TMAXES}, got {tmax}")
    unit_k = topk if balance else None
    return CompiledGemvLayer({"dispatch": compile_dispatch(n_experts, topk, d, "masked", arch, skip_padding=True),
                              "l1": compile_gemv("l1", d, i, tmax, arch, unit_k),
                              "l2": compile_gemv("l2", d, i, tmax, arch, unit_k),
                              "combine": compile_combine(d, topk, arch)}, tmax,
                             {s: gemv_config(s, d, i, tmax, unit_k) for s in ("l1", "l2")})


_PLAN: dict = {}  # the last call's buffers and views (glue.planned)


def _plan(t, topk, n_experts, d, i, max_m, device) -> dict:
    """The masked layout, bf16 h and L2's rows, and the kernels' views of them (glue.planned)."""
    def make(lay: dict) -> dict:
        rows = lay["src"].numel()
        h = torch.empty(rows, i, dtype=torch.bfloat16, device=device)
        y_rows = torch.empty(rows, d, dtype=torch.bfloat16, device=device)
        unused = torch.zeros(1, 1, 1, dtype=torch.float32, device=device)
        return {"lay": lay, "h": h, "y_rows": y_rows, "dispatch": dispatch_args(lay, max_m),
                "l1_x": (lay["codes"].view(torch.int32), lay["scales"].permute(2, 1, 0)),
                "l1_out": h.view(torch.int32), "l2_x": (h.view(torch.int32), unused),
                "l2_out": y_rows.view(torch.int32)}

    return planned(_PLAN, make, t, topk, n_experts, d, i, max_m, device)


def weight_views(experts: tuple) -> tuple:
    """(w1, s1, w3, s3, w2, s2) -> the kernels' views: codes as int32 words [E·N, K/8], scales as bytes."""
    out = []
    for j in range(0, 6, 2):
        w, s = experts[j], experts[j + 1]
        e, n, half = w.shape
        out += [w.contiguous().view(torch.int32).view(e * n, half // 4),
                s.contiguous().view(torch.uint8).view(e * n, -1)]
    return tuple(out)


def run_gemv_layer(compiled: CompiledGemvLayer, x, idx, weights, shared, experts: tuple, n_experts: int, max_m: int,
                   y: torch.Tensor | None = None, check: bool = False) -> torch.Tensor:
    """y = bf16(Σ_k expert_k(x) · w_k + shared) on the GEMV path; experts = (w1, s1, w3, s3, w2, s2) as the
    checkpoint stores them. `check`: read the counts back (a host sync) and raise a ValueError if one
    exceeds max_m or the compiled tmax."""
    k = compiled.kernels
    t, d = x.shape
    i = experts[0].shape[1]
    if n_experts > MAX_GROUPS:
        raise ValueError(f"{n_experts} experts: the GEMV's active list holds at most {MAX_GROUPS}")
    check_dispatch(x, idx, weights, {}, n_experts, max_m, outputs=False)
    out = torch.empty_like(shared) if y is None else y
    p = _plan(t, idx.shape[1], n_experts, d, i, max_m, x.device)
    w1, s1, w3, s3, w2, s2 = weight_views(experts)
    n_sms = sm_count(x.device)
    lay = p["lay"]
    k["dispatch"](x, idx.view(-1), weights.view(-1), *p["dispatch"])
    k["l1"](*p["l1_x"], w1, s1, w3, s3, lay["counts"], lay["row_weight"], p["l1_out"], max_m,
            n_sms * compiled.configs["l1"].min_ctas)
    k["l2"](*p["l2_x"], w2, s2, w2, s2, lay["counts"], lay["row_weight"], p["l2_out"], max_m,
            n_sms * compiled.configs["l2"].min_ctas)
    k["combine"](p["y_rows"], lay["pos"], shared, out)
    if check:
        worst = int(lay["counts"].max())
        if worst > max_m:
            raise ValueError(f"an expert received {worst} entries: more than max_m={max_m}")
    return out
