"""The model op this family's kernels serve (Family.serves; dsv4bench/model/kernel_ops.py): `moe`, the
routed experts plus the shared expert (spec §8.2-8.3). fp32 x in (the model's stream), fp32 out.

Where each part runs:

    part                 CuTeDSL kernels                                   torch
    routed experts       dispatch (permutation + FP8 quant of x) -> L1     the router's idx / weights as
                         (w1|w3 MXFP4 x FP8, clamped SwiGLU x route weight, int32 / fp32; the masked
                         FP8 h) -> L2 (w2) -> combine (+ the shared output) layout's max_m (one bincount)
    shared expert        w1|w3: one FP8 quant+gemm (the gemm family, the   the clamped SwiGLU (fp32),
                         two weights concatenated once per weight); w2:    h cast to bf16
                         quant+gemm

The routed part is the family's `layer` op (kernels/moe/layer.py) on the rule's GEMMs (grouped_config.choose), the
family impl's compile (`run.compiled`): v7 at prefill, at decode v5 and v3 past 64 rows an expert or a mean of 32
(the rule has no one-token GEMV path since session 34: v5 on the sign-laid RS tiles beat it). Every one of them
reads one prepared pair, made ONCE per weight set: the checkpoint's per-expert MXFP4 tensors stacked over experts, w1/w3 interleaved into the L1 weight, the
row frame's side data (kernels/moe/expert_weights.py) and the codes as v5's RS-ordered tiles (expert_weights.rs_tiles), cached
on the source tensors (kernels.common.Prepared: weak references, remade if a source is replaced or written to).
Device bytes beside the checkpoint's: 64 B of code tiles + 8 B of shift words and column scales per 128 K a row,
~1.06x the experts' bytes (the checkpoint's 68); before v8 a block pair and a row frame, ~1.18x. A layer whose
prepared data would not fit the device's free memory is refused (Unsupported), not OOM-killed; a weight of another
frame or code order is refused by layer.run_prepared / layer.weight_views (ValueError). (layer.run_layer prepares
through a one-entry cache keyed on stacked tensors, which would re-prepare every layer at every call: hence this
adapter's own prepared weights, handed to layer.run_prepared.)

Layout per call, the family's rule (sweeps/moe.case): masked [E, max_m, D] for decode-size T (T <=
256, max_m = the call's largest expert count rounded up to 16, the family's `inputs.max_m` rule: one
host read of the counts, none when T·k <= 16 as at decode batch 1), contiguous for prefill; contiguous
also for E > 512 experts (the masked work list's limit).

The shared expert follows the reference's `expert_lowprec` (bf16 GEMM outputs, SwiGLU in fp32, h cast
to bf16 and FP8-quantised again for w2); its bf16 output is added in the combine kernel, so
y = bf16(Σ_k expert_k(x) · w_k + shared) as the family's layer op, returned as fp32.

Refused (Unsupported; the runner runs the oracle and counts it): routed experts not MXFP4 (NVFP4,
dequantised tensors), widths D or I not whole 128-blocks (the tiny config: D 64, I 32), experts of
unequal shapes, an MXFP4 scale that is NaN, a SwiGLU limit other than the kernel's 10, a shared
expert the FP8 GEMM does not take, inputs off the GPU or on a GPU other than SM90 (sm_90a), a prepared
layer that does not fit in memory.
"""

from __future__ import annotations


import torch

from dsv4bench.core.registry import Unsupported
from dsv4bench.model.kernel_ops import device_arch
from kernels.common import Prepared
from kernels.gemm import serves as gemm
from kernels.gemm.tiling import KBLOCK
from kernels.moe.expert_weights import GroupedWeight, prepare_layer, rs_tiles
from kernels.moe.grouped_config import BN, MAX_GROUPS
from kernels.moe.grouped_epilogue import LIMIT
from kernels.moe.inputs import MASKED_ALIGN, count_stats
from kernels.moe.layer import SM90_ONLY, run_prepared
from oracles.linear import QuantWeight, Weight
from oracles.moe import ExpertWeights, swiglu
from sweeps.moe import DECODE_T

MASKED_MAX_T = max(DECODE_T)  # the family's rule: decode batches (masked) up to 256 tokens, prefill above
WIDTH = KBLOCK  # D and I: whole 128-blocks (FP8 act blocks, L1's 256-row tile = 128 intermediates)
CHUNK = 16  # experts prepared at a time (bounds the temporaries of the stacking and the side data)
MEMORY_MARGIN = 2 << 30  # bytes left free beyond a prepared layer (the call's activations, the allocator)
DEVICE_TYPE = "cuda"  # where the kernels run (a CPU test of the argument mapping sets "cpu")

_EXPERTS = Prepared(size=128)  # (L1, L2) per routed expert set: one entry per MoE layer of a model
_SHARED = Prepared(size=128)  # the shared expert's w1|w3 weight


def choose_layout(tokens: int, n_experts: int) -> str:
    """masked for decode-size T (the family's rule), contiguous for prefill or past the masked work list's
    MAX_GROUPS experts."""
    return "masked" if tokens <= MASKED_MAX_T and n_experts <= MAX_GROUPS else "contiguous"


def masked_counts(idx: torch.Tensor, n_experts: int) -> tuple[int, float]:
    """(max_m, mean rows) of a masked call, one host read: the largest expert count of idx rounded up to MASKED_ALIGN,
    and the entries over the experts holding any (CompiledLayer.gemms' wide-pair pick)."""
    flat = idx.reshape(-1)
    flat = flat[(flat >= 0) & (flat < n_experts)]
    if not flat.numel():
        return MASKED_ALIGN, 0.0
    worst, mean = count_stats(torch.bincount(flat, minlength=n_experts))
    return -(-max(1, worst) // MASKED_ALIGN) * MASKED_ALIGN, mean



def _sources(w: Weight) -> tuple:
    if isinstance(w, QuantWeight):
        return (w.weight, w.scale) + (() if w.global_scale is None else (w.global_scale,))
    return (w,)


def _format(w: Weight) -> str:
    return w.format if isinstance(w, QuantWeight) else f"a plain {w.dtype} tensor (dequantised)"


def check_experts(experts, d: int) -> int:
    """The routed experts' intermediate width I, or Unsupported with the reason the kernel cannot take them."""
    if len(experts) == 0:
        raise Unsupported("moe: no routed experts")
    first = experts[0]
    for name in ("w1", "w2", "w3"):
        fmt = _format(getattr(first, name))
        if fmt != "mxfp4":
            raise Unsupported(f"moe: the grouped GEMM widens MXFP4 expert weights; {name} is {fmt}")
    i = first.w1.weight.shape[0]
    if d % WIDTH or i % WIDTH:
        raise Unsupported(f"moe: the grouped GEMM takes D and I in whole {WIDTH}-blocks (FP8 activation blocks, "
                          f"L1's 256-row tiles of 128 intermediates); got D={d}, I={i}")
    want = {"w1": ((i, d // 2), (i, d // 32)), "w3": ((i, d // 2), (i, d // 32)), "w2": ((d, i // 2), (d, i // 32))}
    device = first.w1.weight.device
    for e, ex in enumerate(experts):
        for name, (codes, scales) in want.items():
            w = getattr(ex, name)
            if _format(w) != "mxfp4" or tuple(w.weight.shape) != codes or tuple(w.scale.shape) != scales:
                got = (f"{_format(w)} {tuple(w.weight.shape)} / {tuple(w.scale.shape)}" if isinstance(w, QuantWeight)
                       else _format(w))
                raise Unsupported(f"moe: expert {e} {name} is {got}; the grouped GEMM takes every expert's {name} "
                                  f"as MXFP4 codes {codes} + scales {scales}")
            if w.weight.device != device or w.scale.device != device:
                raise Unsupported(f"moe: expert {e} {name} is on {w.weight.device}, expert 0 on {device}")
    return i


def _empty(e: int, n: int, k: int, device) -> GroupedWeight:
    """A prepared weight's buffers: the RS-ordered code tiles, the row frame's shift words and column scales."""
    kb = k // KBLOCK
    return GroupedWeight(torch.empty(e, -(-n // BN), kb, BN, KBLOCK // 2, dtype=torch.uint8, device=device),
                         torch.empty(e, kb, n, 4, dtype=torch.uint8, device=device),
                         torch.empty(e, kb, n, dtype=torch.float32, device=device), "row", "rs")


def prepared_bytes(e: int, d: int, i: int) -> int:
    """Device bytes of a prepared layer: the code tiles (K/2 a row, N padded to whole BN-row tiles) + shift words and
    column scales (8 per 128 K a row)."""
    per = lambda n, k: -(-n // BN) * BN * k // 2 + n * 8 * (k // KBLOCK)  # noqa: E731
    return e * (per(2 * i, d) + per(d, i))


def _check_memory(device, need: int) -> None:
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if need + MEMORY_MARGIN > free + cached:
        raise Unsupported(f"moe: the layer's prepared expert weights need {need / 2**30:.1f} GiB (+ "
                          f"{MEMORY_MARGIN / 2**30:.0f} GiB margin); the device has {(free + cached) / 2**30:.1f} "
                          f"GiB free")


def prepare_experts(experts, d: int, i: int) -> tuple[GroupedWeight, GroupedWeight]:
    """The (L1, L2) grouped weights of E per-expert MXFP4 weights: stacked, w1/w3 interleaved, the row frame's side
    data, the codes as RS-ordered tiles; CHUNK experts at a time into the final buffers."""
    e = len(experts)
    device = experts[0].w1.weight.device
    _check_memory(device, prepared_bytes(e, d, i))
    l1, l2 = _empty(e, 2 * i, d, device), _empty(e, d, i, device)

    def stacked(part, name, attr):
        return torch.stack([getattr(getattr(ex, name), attr).view(torch.uint8) for ex in part])

    for lo in range(0, e, CHUNK):
        part = [experts[j] for j in range(lo, min(e, lo + CHUNK))]
        try:
            a, b = prepare_layer(*(stacked(part, n, attr) for n in ("w1", "w3", "w2") for attr in ("weight", "scale")),
                                 frame="row")
        except ValueError as err:  # a NaN scale
            raise Unsupported(f"moe: experts {lo}..{lo + len(part) - 1}: {err}") from None
        for dst, src in ((l1, a), (l2, b)):
            dst.codes[lo:lo + len(part)].copy_(rs_tiles(src.codes))
            for field in ("shift", "col_scale"):
                getattr(dst, field)[lo:lo + len(part)].copy_(getattr(src, field))
    return l1, l2


def _drop_dead(cache: Prepared) -> None:
    """Forget prepared layers whose first source tensor is gone (a freed model): their GiBs go back."""
    for key in [k for k, (refs, _, _) in cache._entries.items() if refs[0]() is None]:
        del cache._entries[key]


def _prepare(experts, d: int) -> tuple[GroupedWeight, GroupedWeight]:
    i = check_experts(experts, d)
    _drop_dead(_EXPERTS)
    return prepare_experts(experts, d, i)


def _expert_sources(experts) -> tuple:
    return tuple(t for ex in experts for name in ("w1", "w3", "w2") for t in _sources(getattr(ex, name)))


def layer_weights(experts, d: int, sources: tuple | None = None) -> tuple[GroupedWeight, GroupedWeight]:
    """The prepared (L1, L2) of a routed expert set, made once per weight set (Unsupported if the kernel does not
    take the experts). `sources`: the experts' tensors, when the caller has them already."""
    # host cost per call: ~0.45 ms for 256 experts on a slow CPU (the 1536 sources built, then Prepared's
    # identity + version check of each), the price of an exact cache keyed on the tensors
    if sources is None:
        sources = _expert_sources(experts)
    return _EXPERTS.get(sources, lambda: _prepare(experts, d))


def _cat_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a over b along dim 0, concatenated as bytes (FP8 / E8M0 tensors need no cat kernel of their dtype)."""
    return torch.cat((a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))).view(a.dtype)


def shared_expert(x: torch.Tensor, shared: ExpertWeights, limit: float) -> torch.Tensor:
    """bf16 [T, D]: the shared expert on the gemm family's FP8 GEMM (w1|w3 as one weight, made once)."""
    run = gemm.kernel_runner("gemm")
    w1, w3 = shared.w1, shared.w3
    gate_up = None
    if isinstance(w1, QuantWeight) and isinstance(w3, QuantWeight) and w1.format == w3.format == "fp8" \
            and w1.weight.shape == w3.weight.shape and w1.weight.shape[0] % KBLOCK == 0:
        gate_up = _SHARED.get(_sources(w1) + _sources(w3), lambda: QuantWeight(
            _cat_rows(w1.weight, w3.weight), _cat_rows(w1.scale, w3.scale)))
    if gate_up is not None:
        g, u = gemm.fp8_linear(run, x, gate_up).chunk(2, dim=-1)
    else:
        g, u = gemm.fp8_linear(run, x, w1), gemm.fp8_linear(run, x, w3)
    h = swiglu(g, u, limit).bfloat16()
    return gemm.fp8_linear(run, h, shared.w2)


def routed_layer(run, params: dict, x, idx, weights, shared, l1: GroupedWeight, l2: GroupedWeight) -> torch.Tensor:
    """bf16 [T, D] = bf16(Σ_k expert_k(x) · w_k + shared) on the family's four kernels (layer.run_prepared, with the
    weights prepared here). x bf16 [T, D], idx int32 / weights fp32 [T, k]. max_m is this call's largest count
    (layer_params): no entry is dropped, so no read-back of the counts (check=False)."""
    compiled = run.compiled(params, {"x": x, "idx": idx, "weights": weights, "shared": shared})
    return run_prepared(compiled, x, idx, weights, shared, l1, l2, params["e"], params.get("max_m"), check=False,
                        mean_rows=params.get("mean_rows"))


def layer_params(tokens: int, topk: int, n_experts: int, d: int, i: int, idx: torch.Tensor) -> dict:
    """The family's `layer` case of one call: the layout by the family's rule, max_m from the call's routing."""
    layout = choose_layout(tokens, n_experts)
    params = {"op": "layer", "e": n_experts, "k": topk, "d": d, "i": i, "t": tokens, "layout": layout}
    if layout == "masked":  # T·k entries fit the smallest max_m without a look at the counts (decode at batch 1)
        if tokens * topk <= MASKED_ALIGN:
            params["max_m"] = MASKED_ALIGN
        else:
            params["max_m"], params["mean_rows"] = masked_counts(idx, n_experts)
    return params


def moe(run, x, weights, idx, experts, shared: ExpertWeights, limit: float = LIMIT):
    """The model's `moe` op: x [T, D] (fp32), the router's weights fp32 / idx [T, k], the routed experts
    (ExpertWeights of MXFP4 QuantWeights) and the shared expert (FP8) -> fp32 [T, D]."""
    if limit != LIMIT:
        raise Unsupported(f"moe: the kernel's SwiGLU clamps at {LIMIT}, not {limit}")
    lead, d = x.shape[:-1], x.shape[-1]
    if x.device.type != DEVICE_TYPE:
        raise Unsupported(f"moe: the moe kernels take CUDA tensors, got {x.device}")
    if DEVICE_TYPE == "cuda" and device_arch() != "sm_90a":  # before any weight is prepared
        raise Unsupported(f"moe: {SM90_ONLY}")
    sources = _expert_sources(experts)
    l1, l2 = layer_weights(experts, d, sources=sources)  # the checks, I, the device
    if l1.codes.device != x.device:
        raise Unsupported(f"moe: the experts are on {l1.codes.device}, x on {x.device}")
    rows = x.reshape(-1, d).bfloat16().contiguous()
    tokens = rows.shape[0]
    if tokens == 0:
        return x.new_zeros(x.shape, dtype=torch.float32)
    idx2 = idx.reshape(tokens, -1).to(torch.int32).contiguous()
    w2 = weights.reshape(tokens, -1).float().contiguous()
    params = layer_params(tokens, idx2.shape[1], len(experts), d, l1.shape[1] // 2, idx2)
    s = shared_expert(rows, shared, limit).contiguous()

    out = routed_layer(run, params, rows, idx2, w2, s, l1, l2)
    return out.float().reshape(*lead, d)


OPS = {"moe": moe}
