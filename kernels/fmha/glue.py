"""Our impl: the fmha family's torch tensors mapped onto the SM90 CuTeDSL gathered-key kernel.

`op: decode_fp8` cases (FP8-cache decode) run decode_glue.py's launches instead.

Tensors go in as permuted views (no copies): q/k/v/o [b, s, h, d] -> (s, h, d, b), lse
[b, s, h] -> (s, h, b), indices [b, rows, n] -> (rows, n, b). Dense masks become per-query-block
key ranges (the kernel masks each row by position); sparse cases pass their per-token lists.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl
from kernels.common import Prepared, sm_count
from kernels.fmha.compiling import NO_WINDOW, compile_config
from kernels.fmha.config import LOG2E, Config
from kernels.fmha.decode_pair import FusedQTma
from kernels.fmha.decode_glue import PACKED_MAX_BLOCK, FusedWorkspace, Workspace, compile_decode, compile_fused, run_decode, run_fused
from kernels.fmha.prefill_v11 import V12


def config_for(case: Case) -> Config:
    mask = case["mask"]
    return Config(
        d=case["hd"], dv=case["hd"], hpg=case["h_q"] // case["h_kv"], kv_shared=bool(case["kv_shared"]),
        per_token_idx=mask == "sparse", causal="causal" in mask,
    )


def has_window(case: Case) -> bool:
    return case["mask"] in ("window", "causal_window")


def block_indices(s_q: int, s_kv: int, tq: int, causal: bool, window: int | None, device):
    """(int32 [ceil(s_q/tq), n], int32 [ceil(s_q/tq)]): the key range [lo, hi) that any query of
    each block of tq tokens may see under the bottom-right aligned causal / window mask (-1
    padded), and its length (the kernel visits only that many slots)."""
    off = s_kv - s_q
    t0 = torch.arange(0, s_q, tq, device=device)
    t1 = torch.clamp(t0 + tq, max=s_q) - 1
    lo = torch.zeros_like(t0)
    hi = torch.full_like(t0, s_kv)
    if window:
        lo = torch.clamp(t0 + off - (window - 1), min=0)
        hi = torch.clamp(t1 + off + window, max=s_kv)
    if causal:
        hi = torch.clamp(torch.minimum(hi, t1 + off + 1), min=0)
    lo = torch.minimum(lo, hi)
    n = max(1, int((hi - lo).max()))
    j = lo[:, None] + torch.arange(n, device=device)[None, :]
    idx = torch.where(j < hi[:, None], j, torch.full_like(j, -1)).to(torch.int32)
    return idx, (hi - lo).to(torch.int32)


class FmhaCuteDSL(Impl):
    family, name, backend = "fmha", "cutedsl", "cutedsl"
    archs = ("sm_90a",)
    compiles = True
    # The attention kernel (a declared variant compiles its own subclass, variants.py): v12 (prefill_v11.py:
    # Q by TMA, O by stmatrix + TMA stores a 64-column tile at a time, the hinted gather), the shipped code
    # wherever its preconditions fail. v11 was 1.19-1.29x v10 (`cutedsl:v10`) on the H100; v12 1.00-1.02x
    # v11 (`cutedsl:v11`) on the H200 (docs/perf/fmha.md, "Current standing").
    kernel_class: type = V12
    # decode_fp8: None = v1 (gather + attention + combine, decode_glue.run_decode; `cutedsl:decode-v1`);
    # else the fused kernel's class (decode_fused.py, decode_glue.compile_fused / run_fused). The default
    # is v10 (decode_pair.FusedQTma: v9 = v8 with v12's O store; v10 its head pair prefetching each row once):
    # H200, graph-timed, FlashMLA's FP8 decode / ours 1.20-1.21x geomean over the 16 sweep cases, none below
    # 1.02x (docs/perf/fmha.md).
    decode_form: type | None = FusedQTma

    def __init__(self, persistent_ctas: int | None = None):
        """persistent_ctas: CTAs of a persistent launch (d <= 256), default one per SM; the tests
        pass a few so that every CTA walks many work items."""
        self._sparse_idx = Prepared()  # kernel-format gathered indices of the last index tensor
        self._dense_idx: tuple | None = None  # (case key, kernel-format block lists) of the last dense case
        self._no_sink: dict = {}
        self._decode_ws = None  # decode_glue.Workspace of the last decode shape
        self.persistent_ctas = persistent_ctas

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if arch not in (None, "sm_90a"):
            return f"the SM90 kernel does not target {arch}"
        if case.get("op", "attention") == "decode_fp8":
            from kernels.fmha.decode_family import supports
            return supports(case) or self._packed_limits(case)
        if case["h_q"] % case["h_kv"]:
            return "h_q must be a multiple of h_kv"
        try:
            config_for(case).n_block  # noqa: B018 (validates smem fit)
        except ValueError as e:
            return str(e)
        return None

    def _packed_limits(self, case: Case) -> str | None:
        """The packed-slot producers hold a slot as block << 10 | token in an int32 (decode_prefetch)."""
        if self.decode_form is not None and case["block"] > PACKED_MAX_BLOCK:
            return f"the packed-slot decode takes cache blocks of <= {PACKED_MAX_BLOCK} tokens, not {case['block']}"
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        if case.get("op", "attention") == "decode_fp8":
            return (self.family, self.name, arch, "decode_fp8", case["h_q"], self.decode_form)
        return (self.family, self.name, arch, config_for(case))

    def compile(self, case: Case, arch: str):
        if case.get("op", "attention") == "decode_fp8":
            if self.decode_form is not None:
                return compile_fused(case["h_q"], arch, self.decode_form)
            return compile_decode(case["h_q"], arch)
        return compile_config(config_for(case), arch, self.kernel_class)

    def _indices(self, case: Case, inputs: dict, cfg: Config) -> tuple:
        """Kernel-format (indices (rows, n, b), lengths (rows, b)). Gathered indices are a caller's tensor:
        cached by that tensor (`Prepared`: a new tensor at a freed one's address, or one written in
        place, is remade — the model passes fresh index lists at every step). Block lists of a dense
        mask follow from the case alone."""
        b, dev = case["b"], inputs["q"].device
        if case["mask"] == "sparse":
            idx = inputs["idx"]

            def make():
                lens = torch.full((b, idx.shape[1]), idx.shape[2], dtype=torch.int32, device=dev)
                return idx.permute(1, 2, 0), lens.permute(1, 0)

            return self._sparse_idx.get((idx,), make)
        key = (case.id, dev)
        if self._dense_idx is None or self._dense_idx[0] != key:
            window = case["window"] if has_window(case) else None
            blk, n = block_indices(case["s_q"], case["s_kv"], cfg.tq, cfg.causal, window, dev)
            idx, lens = blk[None].expand(b, -1, -1).contiguous(), n[None].expand(b, -1).contiguous()
            self._dense_idx = (key, (idx.permute(1, 2, 0), lens.permute(1, 0)))
        return self._dense_idx[1]

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        if case.get("op", "attention") == "decode_fp8":
            return self._run_decode(case, inputs, out, compiled)
        cfg = config_for(case)
        sink = inputs.get("sink")
        if sink is None:  # a sink of -inf adds nothing to the denominator
            key = (case["h_q"], inputs["q"].device)
            sink = self._no_sink.setdefault(key, torch.full((case["h_q"],), float("-inf"), device=inputs["q"].device))
        k = inputs["k"]
        compiled(
            inputs["q"].permute(1, 2, 3, 0), k.permute(1, 2, 3, 0), inputs.get("v", k).permute(1, 2, 3, 0),
            *self._indices(case, inputs, cfg), sink, out["out"].permute(1, 2, 3, 0), out["lse"].permute(1, 2, 0),
            case["hd"] ** -0.5 * LOG2E, case["s_kv"] - case["s_q"], case["window"] if has_window(case) else NO_WINDOW,
            self.persistent_ctas or sm_count(inputs["q"].device),
        )
        return out

    def _run_decode(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        fused = self.decode_form is not None
        if self._decode_ws is None:
            self._decode_ws = FusedWorkspace() if fused else Workspace()
        sink = inputs.get("sink")
        if sink is None:
            key = (case["h_q"], inputs["q"].device)
            sink = self._no_sink.setdefault(key, torch.full((case["h_q"],), float("-inf"), device=inputs["q"].device))
        (run_fused if fused else run_decode)(
            compiled, self._decode_ws, inputs["q"], (inputs["cache0"], inputs["cache1"]),
            (inputs["idx0"], inputs["idx1"]), (inputs["len0"], inputs["len1"]), sink, out["out"], out["lse"],
            sm_count(inputs["q"].device))
        return out
