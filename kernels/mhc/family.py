"""The mHC family (spec §3): hc_pre (mixes + RMS scaling, sigmoid pre/post, 20-iteration Sinkhorn,
weighted collapse), hc_post (expand + residual mix) and hc_head; and the embedding lookup that fills the
hc streams (op "embed", §3.1: a row gather copied into the 4 streams, kernels/mhc/embed.py); oracle
pairing, cost, impls.

embed inputs: ids int64 [T] and a [V, D] bf16 table that holds 2^100 in every row no id names (a read
of a wrong row fails by far; finite, since the harness's unchanged-input check compares with
torch.equal, which NaN never passes); the oracle is `embed_streams` (exact: the kernel copies bits), in
fp32.

Tolerance of the fp32 outputs (post, comb, and y through pre): the low-precision reference is the
oracle with fn rounded to TF32, the precision of the production mix GEMM (DeepGEMM
`tf32_hc_prenorm_gemm`, spec §3.4). An fp32 kernel differs from the fp32 oracle only by
summation order over 4·D terms, which no single-rounding floor covers.
"""

from __future__ import annotations

from typing import ClassVar

import cutlass
import torch
from cutlass import cute
from cutlass.cute.runtime import make_fake_compact_tensor

from dsv4bench.core.case import Case
from dsv4bench.core.registry import (
    Option,
    Cost,
    Family,
    Impl,
    Tolerance,
    register_family,
    register_impl,
)
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import TORCH_DTYPES, compile_kernel, fake_rowmajor
from kernels.mhc import serves as served
from kernels.mhc.apply import HcApplyKernel
from kernels.mhc.embed import EmbedKernel
from kernels.mhc.mix import HcMixKernel, pick_tiling
from kernels.mhc.post import HcPostKernel
from oracles.mhc import (
    HC_MULT,
    embed_streams,
    hc_head,
    hc_head_lowprec,
    hc_post,
    hc_post_lowprec,
    hc_pre,
    hc_pre_lowprec,
    sinkhorn,
)
from sweeps import mhc as space

N_MIX = {"pre": (2 + HC_MULT) * HC_MULT, "head": HC_MULT}


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 → the nearest TF32 value (10 mantissa bits, ties to even), kept in fp32."""
    bits = x.float().contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


class MhcFamily(Family):
    name = "mhc"
    description = (
        "mHC hc_pre (mixes, Sinkhorn, collapse), hc_post, hc_head over [T, 4, D] (§3)"
    )
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/mhc/serves.py)
    options: ClassVar[dict[str, Option]] = {
        "op": Option("op", "which mHC step (embed: the lookup that fills the streams)",
                     choices=("pre", "post", "head", "embed"), names=True),
        "rows": Option("t", "tokens", "tokens"),
        "width": Option("d", "hidden size D of one stream", "elements"),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        t, d = case["t"], case["d"]
        if case["op"] == "embed":
            return embed_inputs(case, gen, device)
        x = (torch.randn(t, HC_MULT, d, generator=gen) + 0.25).bfloat16()
        if case["op"] == "post":
            logits = 2.0 * torch.randn(t, HC_MULT, HC_MULT, generator=gen)
            inputs = {
                "o": torch.randn(t, d, generator=gen).bfloat16(),
                "residual": x,
                "post": 2.0 * torch.rand(t, HC_MULT, generator=gen),
                "comb": sinkhorn(logits),
            }
        else:
            n_mix = N_MIX[case["op"]]
            fn = torch.randn(n_mix, HC_MULT * d, generator=gen) * (HC_MULT * d) ** -0.5
            n_scale = 1 if case["op"] == "head" else 3
            inputs = {
                "x": x,
                "fn": fn,
                "scale": 0.5 + torch.rand(n_scale, generator=gen),
                "base": 0.5 * torch.randn(n_mix, generator=gen),
            }
        return {k: v.to(device) for k, v in inputs.items()}

    def oracle(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "embed":
            return {"out": embed_streams(inputs["ids"], inputs["weight"], HC_MULT).float()}
        if case["op"] == "post":
            return {
                "out": hc_post(
                    inputs["o"], inputs["residual"], inputs["post"], inputs["comb"]
                )
            }
        if case["op"] == "head":
            return {
                "y": hc_head(inputs["x"], inputs["fn"], inputs["scale"], inputs["base"])
            }
        y, post, comb = hc_pre(
            inputs["x"], inputs["fn"], inputs["scale"], inputs["base"]
        )
        return {"y": y, "post": post, "comb": comb}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "embed":  # the reference's gather: exact
            return {"out": embed_streams(inputs["ids"], inputs["weight"], HC_MULT)}
        if case["op"] == "post":
            return {
                "out": hc_post_lowprec(
                    inputs["o"], inputs["residual"], inputs["post"], inputs["comb"]
                )
            }
        fn = tf32_round(inputs["fn"])
        if case["op"] == "head":
            return {
                "y": hc_head_lowprec(inputs["x"], fn, inputs["scale"], inputs["base"])
            }
        y, post, comb = hc_pre_lowprec(inputs["x"], fn, inputs["scale"], inputs["base"])
        return {"y": y, "post": post, "comb": comb}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        t, d = case["t"], case["d"]
        if case["op"] in ("post", "embed"):
            dtype = TORCH_DTYPES[case["dtype"]]
            return {"out": torch.empty(t, HC_MULT, d, dtype=dtype, device=device)}
        out = {"y": torch.empty(t, d, dtype=torch.bfloat16, device=device)}
        if case["op"] == "pre":
            out["post"] = torch.empty(t, HC_MULT, device=device)
            out["comb"] = torch.empty(t, HC_MULT, HC_MULT, device=device)
        return out

    def cost(self, case: Case) -> Cost:
        t, d, op = case["t"], case["d"], case["op"]
        k = HC_MULT * d
        if op == "embed":  # read a row and the id, write it to the 4 streams (the table is read sparsely)
            size = torch.finfo(TORCH_DTYPES[case["dtype"]]).bits // 8
            return Cost(flops=0.0, bytes=float(t * ((1 + HC_MULT) * d * size + 8)))
        if op == "post":  # read o + 4 streams + 20 weights, write 4 streams
            return Cost(
                flops=float(t * k * 10), bytes=float(t * (2 * (d + 2 * k) + 4 * 20))
            )
        n_mix = N_MIX[op]
        # read x once, fn once, write y (+ post, comb); flops: the mix GEMM, sum of squares, collapse
        small = 4 * (HC_MULT + HC_MULT * HC_MULT) if op == "pre" else 0
        return Cost(
            flops=float(t * (2 * n_mix * k + 2 * k + 2 * k)),
            bytes=float(t * (2 * k + 2 * d + small) + 4 * n_mix * k),
        )


class MhcCuteDSL(Impl):
    family, name, backend = "mhc", "cutedsl", "cutedsl"
    compiles = True
    pdl = True  # pass 2 as a programmatic dependent launch (off: the declared variant cutedsl:no-pdl)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["op"] == "embed":
            if case["dtype"] not in ("bf16", "fp32"):
                return f"the embed kernel copies bf16 or fp32 rows, not {case['dtype']}"
            if not case["t"]:
                return "no token"
        return None if case["d"] % 8 == 0 else "mHC kernels need D % 8 == 0"

    def _tiling(self, case: Case) -> tuple[int, int]:
        """Pass 1's (MMA row tiles per warp, K chunk), chosen from T."""
        return pick_tiling(HC_MULT * case["d"], case["t"])

    def compile_key(self, case: Case, arch: str) -> tuple:
        if case["op"] == "embed":
            return (self.family, self.name, arch, "embed", case["d"], case["dtype"])
        tiling = None if case["op"] == "post" else self._tiling(case)
        return (self.family, self.name, arch, case["op"], case["d"], tiling)

    def compile(self, case: Case, arch: str):
        d, t = case["d"], cute.sym_int()
        if case["op"] == "embed":
            dt = case["dtype"]
            fake = (make_fake_compact_tensor(cutlass.Int64, (t,), assumed_align=8),
                    fake_rowmajor(dt, (cute.sym_int(), d)), fake_rowmajor(dt, (t, HC_MULT, d)))
            return compile_kernel(EmbedKernel(d, torch.finfo(TORCH_DTYPES[dt]).bits // 8), *fake, arch=arch)
        if case["op"] == "post":
            fake = (
                fake_rowmajor("bf16", (t, d)),
                fake_rowmajor("bf16", (t, HC_MULT, d)),
                fake_rowmajor("fp32", (t, HC_MULT)),
                fake_rowmajor("fp32", (t, HC_MULT * HC_MULT)),
                fake_rowmajor("bf16", (t, HC_MULT, d)),
            )
            return compile_kernel(HcPostKernel(d), *fake, arch=arch)
        mix, apply = self._passes(case)
        part = make_fake_compact_tensor(
            cutlass.Float32,
            (t, mix.splits, mix.n_mix + 1),
            stride_order=(2, 1, 0),
            assumed_align=4,
        )
        fake = (
            fake_rowmajor("bf16", (t, HC_MULT * d)),
            fake_rowmajor("fp32", (mix.n_mix, HC_MULT * d)),
            part,
            fake_rowmajor("bf16", (t, HC_MULT, d)),
            fake_rowmajor("fp32", (1 if apply.head else 3,), 4),
            fake_rowmajor("fp32", (mix.n_mix,), 4),
            fake_rowmajor("bf16", (t, d)),
            fake_rowmajor("fp32", (t, HC_MULT), 4),
            fake_rowmajor("fp32", (t, HC_MULT * HC_MULT), 4),
        )
        return compile_kernel(HcTwoPass(mix, apply), *fake, arch=arch)

    def _passes(self, case: Case) -> tuple[HcMixKernel, HcApplyKernel]:
        head = case["op"] == "head"
        tm, chunk = self._tiling(case)
        mix = HcMixKernel(N_MIX[case["op"]], HC_MULT * case["d"], chunk, tm)
        return mix, HcApplyKernel(head, case["d"], mix.splits, pdl=self.pdl)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        t = case["t"]
        if case["op"] == "embed":
            compiled(inputs["ids"], inputs["weight"], out["out"])
            return out
        if case["op"] == "post":
            compiled(
                inputs["o"],
                inputs["residual"],
                inputs["post"],
                inputs["comb"].view(t, -1),
                out["out"],
            )
            return out
        x = inputs["x"]
        mix, _ = self._passes(case)
        part = torch.empty(t, mix.splits, mix.n_mix + 1, device=x.device)  # [T, splits, n_mix + 1]
        post = out.get("post", torch.empty(t, HC_MULT, device=x.device))
        comb = out.get("comb", torch.empty(t, HC_MULT, HC_MULT, device=x.device))
        compiled(x.view(t, -1), inputs["fn"], part, x, inputs["scale"], inputs["base"], out["y"], post,
                 comb.view(t, -1))
        return out


class HcTwoPass:
    """hc_pre / hc_head as one compiled function: pass 1 (mix partials per K split) then pass 2
    (reduce, Sinkhorn, collapse, a programmatic dependent launch) on the same stream. One host call
    instead of two measured the same (the host is ahead of the GPU; the decode gap between the
    passes was the dependent launch, which PDL hides: docs/perf/mhc.md, v5); one function is simply
    one artifact to cache and call."""

    def __init__(self, mix: HcMixKernel, apply: HcApplyKernel):
        self.mix, self.apply = mix, apply

    @cute.jit
    def __call__(self, mX2: cute.Tensor, mFn: cute.Tensor, mPart: cute.Tensor, mX: cute.Tensor, mScale: cute.Tensor,
                 mBase: cute.Tensor, mY: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, stream):
        self.mix(mX2, mFn, mPart, stream)
        self.apply(mPart, mX, mScale, mBase, mY, mPost, mComb, stream)


UNNAMED_ROW = 2.0**100  # the embed table's rows no id names: exact in bf16, far beyond any real row


def embed_inputs(case: Case, gen: torch.Generator, device: str) -> dict:
    """ids [T] (random over the table, or `edges`: 0, V − 1, −1, −V first, then random, negative ones
    among them) and the [V, D] table: random rows where an id points, UNNAMED_ROW elsewhere."""
    t, d, v = case["t"], case["d"], case["v"]
    ids = torch.randint(0, v, (t,), generator=gen)
    if case["ids"] == "edges":
        edges = torch.tensor([0, v - 1, -1, -v])[:t]
        ids[:len(edges)] = edges
        flip = torch.rand(t, generator=gen) < 0.25
        flip[:len(edges)] = False  # the four edges stay as named
        ids = torch.where(flip & (ids >= 0), ids - v, ids)  # the same rows, named from the end
    rows = torch.unique(torch.where(ids < 0, ids + v, ids))
    weight = torch.full((v, d), UNNAMED_ROW, dtype=TORCH_DTYPES[case["dtype"]])
    weight[rows] = torch.randn(len(rows), d, generator=gen).to(weight.dtype)
    return {"ids": ids.to(device), "weight": weight.to(device)}


def _eager(fns: dict, case: Case, inputs: dict) -> dict:
    if case["op"] == "embed":
        return {"out": fns["embed"](inputs["ids"], inputs["weight"], HC_MULT)}
    if case["op"] == "post":
        return {
            "out": fns["post"](
                inputs["o"], inputs["residual"], inputs["post"], inputs["comb"]
            )
        }
    if case["op"] == "head":
        return {
            "y": fns["head"](inputs["x"], inputs["fn"], inputs["scale"], inputs["base"])
        }
    y, post, comb = fns["pre"](
        inputs["x"], inputs["fn"], inputs["scale"], inputs["base"]
    )
    return {"y": y, "post": post, "comb": comb}


EAGER = {"pre": hc_pre_lowprec, "post": hc_post_lowprec, "head": hc_head_lowprec, "embed": embed_streams}


register_family(MhcFamily())
register_impl(MhcCuteDSL())
# the reference's composition (F.linear mixes, torch Sinkhorn loop, weighted sum), one fn per op
register_torch_baselines("mhc", EAGER, _eager)

# Declared variants (ablations, run only when named: `--impl cutedsl:<variant>`).
# They subclass MhcCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.mhc import variants  # noqa: E402,F401
