"""The `deepgemm-kernels` layer peer: what a serving stack on DeepGEMM would run, the peer that issue #22's
done-whens 2 (decode, masked) and 3 (prefill, contiguous) compare our layer against:

    OUR dispatch kernel (kernels/moe/dispatch.py) -> DeepGEMM L1 (w1|w3) -> SwiGLU x route weight + FP8 h
    quantisation (one Triton kernel, kernels/moe/peer_activation.py; masked: each expert's counted rows only)
    -> DeepGEMM L2 (w2) -> OUR combine kernel (kernels/moe/combine.py, + the shared output)

The weights are the `deepgemm` peer's FP8 128 x 128 conversion (`peers.fp8_weights`, made once per weight
buffers, outside the timed call); the DeepGEMM calls and the operand views are the same helpers.

Our dispatch writes DeepGEMM's activation layout directly: e4m3 codes K-major and fp32 ue8m0 scales
MN-major ([K/128, rows] contiguous, [E, K/128, max_m] masked). Contiguous: the segments are padded to
TILE_M = 128 rows, DeepGEMM's SM90 `get_mk_alignment_for_contiguous_layout()` (checked at the first
call), and the `expert` row ids are its `grouped_layout` (-1 on padding). Masked: the dispatch kernel
takes max_m at run time (rows / E), so the peer allocates its layout with max_m = the case's max_m
rounded up to DG_MASKED_ALIGN = 128 (`peers.dg_rows_per_expert`): the rows DeepGEMM's masked kernel
stores are then its own group's, and no row is copied in the timed call. The padding rows are not
gathered (skip_padding, as our layer's dispatch): DeepGEMM computes and stores them (in whole BLOCK_M
blocks) from whatever they hold, row by row; the activation skips them (masked: rows past a count) or
zeroes them (contiguous: DeepGEMM's L2 reads their blocks). The counts are the dispatch's own (a case's
max_m bounds them by construction: no clamp, no sync).

The dispatch / combine compiles and the activation's Triton compile happen at the first call for a
(E, k, D, layout) / device, which the harness makes before it times (its correctness run and warm-up).
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import import_reason
from kernels.moe import peer_activation
from kernels.moe.peers import DeepGemm, dg_expected_m, dg_grouped, dg_operand, dg_rows_per_expert, fp8_weights

SM90_ONLY = "our dispatch writes the SM90 FP8 layout (fp32 MN-major scales); DeepGEMM's SM100 path reads packed ue8m0"
_KERNELS: dict = {}  # (E, k, D, layout, arch) -> (dispatch, combine)
_PLAN: dict = {}  # the last shape's buffers and views (one key)


def our_kernels(e: int, k: int, d: int, layout: str, arch: str = "sm_90a") -> tuple:
    """(dispatch, combine) compiled for the layer's shape: our kernels as our layer compiles them (masked:
    padding rows not gathered)."""
    key = (e, k, d, layout, arch)
    if key not in _KERNELS:
        from kernels.moe.glue import compile_combine, compile_dispatch

        _KERNELS[key] = (compile_dispatch(e, k, d, layout, arch, skip_padding=layout == "masked"),
                         compile_combine(d, k, arch))
    return _KERNELS[key]


def plan(t: int, k: int, e: int, d: int, i: int, m: int | None, device) -> dict:
    """The dispatch buffers (DeepGEMM's layout: masked m rows per expert), L1 / L2's bf16 outputs and the
    DeepGEMM operand views, made once per shape, device and stream (as our layer's `_plan`)."""
    from kernels.moe.glue import alloc_dispatch

    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (t, k, e, d, i, m, str(device), stream)
    if key not in _PLAN:
        _PLAN.clear()
        lay = alloc_dispatch(t, k, e, d, m, device)
        rows = lay["src"].numel()
        _PLAN[key] = {
            "lay": lay, "d1": torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=device),
            "d2": torch.empty(rows, d, dtype=torch.bfloat16, device=device),
            "dispatch": (lay["counts"], lay["pos"].view(-1), lay["src"], lay["expert"], lay["row_weight"],
                         lay["codes"], lay["scales"] if m is not None else lay["scales"].unsqueeze(0)),
            "a1": dg_operand(lay["codes"], lay["scales"], e, m),
            "group": lay["expert"] if m is None else lay["counts"]}
        # h and its scales, DeepGEMM's L2 operand (masked: rows past a count keep what they hold, finite)
        h = torch.zeros(rows, i, dtype=torch.uint8, device=device)
        h_s = torch.zeros((i // 128, rows) if m is None else (e, i // 128, m), dtype=torch.float32, device=device)
        _PLAN[key].update(h=h, h_s=h_s, a2=dg_operand(h, h_s, e, m))
    return _PLAN[key]


class DeepGemmKernels(DeepGemm):
    name = "deepgemm-kernels"
    backend = "deepgemm"

    def available(self) -> str | None:
        return import_reason("deep_gemm") or import_reason("cutlass") or import_reason("triton")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if arch in (None, "any"):  # a peer's run task names no arch: the device's
            arch = "sm_90a" if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] == 9 else "other"
        if arch != "sm_90a":
            return SM90_ONLY
        return super().supports(case, arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from kernels.moe.family import case_max_m
        from oracles.moe import TILE_M

        x, idx, e, i = inputs["x"], inputs["idx"], case["e"], case["i"]
        t, d = x.shape
        k = idx.shape[1]
        (w13, s13), (w2, s2) = fp8_weights(inputs)
        m = dg_rows_per_expert(case)
        if m is None:
            import deep_gemm

            if deep_gemm.get_mk_alignment_for_contiguous_layout() != TILE_M:
                raise ValueError(f"DeepGEMM's contiguous alignment is not our dispatch's {TILE_M}-row segments")
        dispatch, comb = our_kernels(e, k, d, case["layout"])
        p = plan(t, k, e, d, i, m, x.device)
        lay, expected = p["lay"], dg_expected_m(case) if m is not None else 0
        dispatch(x, idx.view(-1), inputs["weights"].view(-1), *p["dispatch"])
        dg_grouped(p["a1"], (w13, s13), p["d1"], p["group"], m, expected)
        peer_activation.swiglu_quant_into(p["d1"], lay["row_weight"], lay["src"], p["h"], p["h_s"],
                                          None if m is None else lay["counts"], case_max_m(case))
        dg_grouped(p["a2"], (w2, s2), p["d2"], p["group"], m, expected)
        comb(p["d2"], lay["pos"], inputs["shared"], out["out"])
        return out
