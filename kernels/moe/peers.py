"""Peers of the moe family, in the same process.

layer:
- `deepgemm`: DeepGEMM `m_grouped_fp8_gemm_nt_contiguous` (contiguous cases) / `_masked` (masked cases)
  for w1|w3 (one GEMM, N = 2I: gate rows then up rows) and for w2, on the MXFP4 weights converted to
  FP8 e4m3 with one ue8m0 scale per 128 x 128 block (`to_fp8_blocks`); torch does the dispatch
  (oracles.moe.dispatch_layout + gather_quant), the clamped SwiGLU x route weight, the FP8
  quantisation of h and the combine. Masked: DeepGEMM's SM90 kernel reads A and stores D in whole
  BLOCK_M (64 or 128) row blocks at group·max_m + block·BLOCK_M of the [E·max_m, ·] matrix, so each
  expert's rows are padded to DG_MASKED_ALIGN = 128 (the case's max_m is a multiple of 16 only), else a
  block of expert g overwrites expert g+1's output rows.
  The conversion: dequantise, block amax -> scale 2^ceil(log2(amax / 448)), RNE to e4m3. It is exact
  when, inside a 128 x 128 block, the MXFP4 scale exponents span <= 14 binades (a code c·2^s lands on
  c·2^(s - smax + 6) ≥ 2^-9 times the block scale: an e4m3 subnormal step or coarser); wider blocks
  lose their smallest values (`conversion_error` counts them; the synthetic weights span 3 binades:
  exact, tests/moe/test_moe_cpu.py).
- `deepgemm-kernels` (kernels/moe/peer_kernels.py): what a serving stack would run, the peer of issue #22's
  done-whens 2 and 3: OUR dispatch kernel (it writes DeepGEMM's layout: masked at DG_MASKED_ALIGN rows an
  expert), the same DeepGEMM calls and FP8 weights (`dg_grouped`, `dg_operand`, `fp8_weights`), the
  activation as one Triton kernel (kernels/moe/peer_activation.py, `swiglu_quant`'s math), and OUR combine kernel.
- `torch_grouped_mm`: torch._grouped_mm (bf16, SM90+; in torch since 2.8, present in 2.11 and 2.13)
  on the dequantised bf16 weights, the entries sorted by expert without padding (offs = cumsum counts).
- `torch`: the eager per-expert loop, bf16 matmuls on the dequantised weights.
  The converted / dequantised weights are made once per weight buffer (`Prepared`), outside the timed
  call, as a deployment that keeps them would; activations are bf16 (no FP8 act quant).
dispatch / combine: `torch`, the oracle's own torch composition on the device.
No torch.compile peer: the layout's sort / bincount / data-dependent gathers break the graph.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, import_reason, register_impl
from kernels.common import Prepared
from kernels.moe.inputs import StackedExperts, expert_bytes
from oracles.linear import dequant
from oracles.moe import combine, contiguous_rows, dispatch_layout, gather_quant, swiglu
from oracles.quant import fp8_block_quant, ue8m0_scale

BLOCK = 128
# Rows per expert of DeepGEMM's masked layout: a multiple of its SM90 masked BLOCK_M candidates {64, 128}
# (csrc/jit_kernels/heuristics/sm90.hpp). The kernel TMA-stores D in full BLOCK_M-row boxes at
# current_group_idx * shape_m + m_block_idx * BLOCK_M of D viewed as [G * max_m, N] (scheduler/gemm.cuh
# get_global_idx, impls/sm90_fp8_gemm_1d2d.cuh), clipped only at the end of the whole tensor.
DG_MASKED_ALIGN = 128
LAYER_ONLY = "a peer of the whole layer (dispatch and combine alone: ours and torch)"


def _experts(inputs: dict) -> StackedExperts:
    from kernels.moe.family import experts_of  # the family imports this module

    return experts_of(inputs)


def dequant_stack(experts: StackedExperts, which: str) -> torch.Tensor:
    """fp32 [E, N, K] of one weight (w1, w3 or w2) of every expert."""
    return torch.stack([dequant(getattr(experts[e], which)) for e in range(len(experts))])


def to_fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [E, N, K] (N, K multiples of 128) -> (e4m3 [E, N, K], fp32 ue8m0 scales [E, N/128, K/128])."""
    e, n, k = w.shape
    blocks = w.view(e, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = ue8m0_scale(blocks.abs().amax((2, 4)).clamp(min=1e-4), 448.0)
    codes = (blocks / scale[:, :, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.view(e, n, k), scale


def conversion_error(w: torch.Tensor) -> tuple[int, float]:
    """(elements the 128 x 128 FP8 conversion changes, their max |change|) for fp32 weights [E, N, K]."""
    codes, scale = to_fp8_blocks(w)
    e, n, k = w.shape
    back = (codes.float().view(e, n // BLOCK, BLOCK, k // BLOCK, BLOCK) * scale[:, :, None, :, None]).view(e, n, k)
    diff = (back - w).abs()
    return int((diff > 0).sum()), float(diff.max())


_FP8, _BF16 = Prepared(), Prepared()


def fp8_weights(inputs: dict):
    """((w13 e4m3 [E, 2I, D], scales), (w2 e4m3 [E, D, I], scales)), made once per weight buffers, one expert at
    a time (the blocks are per expert: the same codes as converting the stack, without its fp32 copy, 4x the FP8
    bytes: 100 GB for Pro's 384 experts)."""
    def convert(ex, names):
        parts = [to_fp8_blocks(torch.cat([dequant(getattr(ex[e], n)) for n in names])[None]) for e in range(len(ex))]
        return torch.cat([c for c, _ in parts]), torch.cat([s for _, s in parts])

    def make():
        ex = _experts(inputs)
        return convert(ex, ("w1", "w3")), convert(ex, ("w2",))
    return _FP8.get(tuple(inputs[n] for n in ("w1", "w3", "w2")), make)


def bf16_weights(inputs: dict):
    """(w13 bf16 [E, 2I, D], w2 bf16 [E, D, I]), made once per weight buffers."""
    def make():
        ex = _experts(inputs)
        return (torch.cat([dequant_stack(ex, "w1"), dequant_stack(ex, "w3")], 1).bfloat16(),
                dequant_stack(ex, "w2").bfloat16())
    return _BF16.get(tuple(inputs[n] for n in ("w1", "w3", "w2")), make)


def weighted_swiglu(gate_up: torch.Tensor, row_weight: torch.Tensor) -> torch.Tensor:
    """fp32 route_weight · silu(min(g, 10)) · clamp(u, ±10) of [rows, 2I] (gate columns, then up)."""
    g, u = gate_up.float().chunk(2, dim=-1)
    return swiglu(g, u) * row_weight.unsqueeze(-1)


class LayerPeer(Impl):
    family, backend = "moe", "torch"
    archs = ("any",)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        return None if case["op"] == "layer" else LAYER_ONLY


def dg_rows_per_expert(case: Case) -> int | None:
    """Rows per expert of DeepGEMM's masked layout for the case (its max_m rounded up to DG_MASKED_ALIGN);
    None for a contiguous case."""
    from kernels.moe.family import case_max_m  # the family imports this module

    m = case_max_m(case)
    return None if m is None else -(-m // DG_MASKED_ALIGN) * DG_MASKED_ALIGN


def dg_expected_m(case: Case) -> int:
    """DeepGEMM's masked `expected_m` (a tuning hint > 0): the mean entries per expert."""
    return max(1, case["t"] * case["k"] // case["e"])


def dg_operand(codes: torch.Tensor, scales: torch.Tensor, e: int, m: int | None) -> tuple:
    """Dispatch-layout FP8 activations -> DeepGEMM's A, as views (no copy): codes (uint8 or e4m3) [rows, K]
    and MN-major fp32 scales [K/128, rows] (contiguous, m None) or [E, K/128, m] (masked) -> (e4m3 [rows, K],
    scales [rows, K/128] (stride 1 along rows)) or (e4m3 [E, m, K], scales [E, m, K/128]): the
    TMA-aligned MN-major scale layout DeepGEMM's SM90 FP8 kernels read, so it makes no transposed copy
    (m a multiple of 4)."""
    fp8 = codes.view(torch.float8_e4m3fn)
    if m is None:
        return fp8, scales.t()
    return fp8.view(e, m, -1), scales.reshape(e, -1, m).transpose(1, 2)


def dg_grouped(a: tuple, b: tuple, d: torch.Tensor, group: torch.Tensor, m: int | None, expected: int) -> None:
    """One DeepGEMM grouped FP8 GEMM into bf16 d [rows, N]: contiguous (m None; group = the layout's
    `expert` row ids, -1 on padding) or masked (group = int32 counts [E] <= m; d viewed [E, m, N]).
    DeepGEMM's tests: A e4m3 K-major, its scales fp32 (any MN-major or row-major strides: DeepGEMM makes
    them TMA-aligned MN-major), expected_m > 0, m a multiple of BLOCK_M (DG_MASKED_ALIGN)."""
    import deep_gemm

    if m is None:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, group)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_masked(a, b, d.view(group.numel(), m, -1), group, expected)


def swiglu_quant(gate_up: torch.Tensor, row_weight: torch.Tensor, src: torch.Tensor, e: int, m: int | None):
    """L1's bf16 output [rows, 2I] -> h = route weight · SwiGLU (fp32; 0 on padding rows, src < 0: DeepGEMM
    leaves them unwritten, so whatever they hold never reaches h's codes or scales) -> FP8 per 128
    (oracles.quant.fp8_block_quant): (e4m3 [rows, I], MN-major fp32 scales [I/128, rows] (m None) or
    [E, I/128, m]), the layout `dg_operand` takes. Eager in `deepgemm`; `deepgemm-kernels` runs the same
    math as one Triton kernel (kernels/moe/peer_activation.py)."""
    h = torch.where((src >= 0).unsqueeze(-1), weighted_swiglu(gate_up, row_weight), 0.0)
    codes, scales = fp8_block_quant(h, BLOCK)
    if m is None:
        return codes, scales.t().contiguous()
    return codes, scales.view(e, m, -1).transpose(1, 2).contiguous()


class DeepGemm(LayerPeer):
    name = backend = "deepgemm"

    def available(self) -> str | None:
        return import_reason("deep_gemm")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["d"] % BLOCK or case["i"] % BLOCK:
            return f"D and I must be multiples of {BLOCK} (whole FP8 weight blocks)"
        return super().supports(case, arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        import deep_gemm

        x, e, i = inputs["x"], case["e"], case["i"]
        (w13, s13), (w2, s2) = fp8_weights(inputs)
        m = dg_rows_per_expert(case)  # DeepGEMM's masked groups: whole BLOCK_M row blocks (DG_MASKED_ALIGN)
        tile = deep_gemm.get_mk_alignment_for_contiguous_layout()
        rows = e * m if m is not None else contiguous_rows(x.shape[0], case["k"], e, tile)
        lay = dispatch_layout(inputs["idx"], inputs["weights"], e, rows, m, tile)
        codes, sa = gather_quant(x, lay["src"], 1 if m is None else e)
        group, expected = (lay["expert"], 0) if m is None else (lay["counts"].clamp(max=m), dg_expected_m(case))
        d1 = torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=x.device)
        d2 = torch.empty(rows, x.shape[1], dtype=torch.bfloat16, device=x.device)
        dg_grouped(dg_operand(codes, sa, e, m), (w13, s13), d1, group, m, expected)
        h8, sh = swiglu_quant(d1, lay["row_weight"], lay["src"], e, m)
        dg_grouped(dg_operand(h8, sh, e, m), (w2, s2), d2, group, m, expected)
        return {"out": combine(d2, lay["pos"], inputs["shared"]).bfloat16()}


BF16_PEER_BYTES = 24e9  # the bf16 peers' dequantised copy (4x the MXFP4 bytes) beside the case on an 80 GB part


def bf16_refusal(case: Case) -> str | None:
    """Why the bf16 peers cannot hold the case's experts (Pro's 384: 54 GB), or None."""
    need = 4 * case["e"] * expert_bytes(case["d"], case["i"])
    return None if need <= BF16_PEER_BYTES else f"the bf16 copy of {case['e']} experts is {need / 1e9:.0f} GB (> {BF16_PEER_BYTES / 1e9:.0f} GB)"


class TorchGroupedMM(LayerPeer):
    name = "torch_grouped_mm"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        return super().supports(case, arch) or (bf16_refusal(case) if case["op"] == "layer" else None)

    def available(self) -> str | None:
        return None if hasattr(torch, "_grouped_mm") else f"torch {torch.__version__} has no torch._grouped_mm"

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        x, e = inputs["x"], case["e"]
        w13, w2 = bf16_weights(inputs)
        n = inputs["idx"].numel()
        lay = dispatch_layout(inputs["idx"], inputs["weights"], e, n, None, 1)  # sorted, no padding
        offs = torch.cumsum(lay["counts"], 0, dtype=torch.int32)
        gate_up = torch._grouped_mm(x[lay["src"].long()], w13.transpose(1, 2), offs=offs)
        h = weighted_swiglu(gate_up, lay["row_weight"]).bfloat16()
        rows = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
        return {"out": combine(rows, lay["pos"], inputs["shared"]).bfloat16()}


class TorchEager(Impl):
    """Every op: the layer as an eager per-expert loop (bf16 matmuls); dispatch / combine as the oracle's
    torch composition."""

    family, name, backend = "moe", "torch", "torch"
    archs = ("any",)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        return bf16_refusal(case) if case["op"] == "layer" else None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from kernels.moe.family import FAMILY

        if case["op"] != "layer":
            return FAMILY.lowprec(case, inputs)
        x, idx = inputs["x"], inputs["idx"]
        w13, w2 = bf16_weights(inputs)
        y = inputs["shared"].float()
        for e in idx.unique().tolist():
            tok, slot = torch.where(idx == e)
            h = weighted_swiglu(x[tok] @ w13[e].t(), inputs["weights"][tok, slot]).bfloat16()
            y.index_add_(0, tok, (h @ w2[e].t()).float())
        return {"out": y.bfloat16()}


def register() -> None:
    from kernels.moe.peer_kernels import DeepGemmKernels  # it imports this module's helpers

    for impl in (DeepGemm(), DeepGemmKernels(), TorchGroupedMM(), TorchEager()):
        register_impl(impl)
