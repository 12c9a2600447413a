"""The compressor_decode family (spec §5.5, §5.7): the compressor's decode-time ops, the steps the model
takes token by token once its prefill is pooled (the compressor family, kernels/compressor/, pools
whole blocks of a prefill from position 0 and fuses the post-processing). Two ops (`op` of a case):

  push  one token t of B sequences into the reference's fp32 state [B, coff·m, coff·d], updated in
        place; outputs the new state (kv, score) and, when t completes a block, the raw entry [B, d]
        (fp32). Oracle: `CompressorState.push`; low-precision reference: the same with the entry rounded
        to bf16, the precision at which the reference's post-processing takes it (§5.5 `cast_bf16(c)`).
        The state is a copy of the inputs' (the harness keeps inputs unchanged), so a timed push also
        pays two device copies of the state.
  post  the post-processing of B given raw entries at entry ids s (§5.5): RMSNorm, RoPE at s·m, then
        the FP8 NoPE qdq (main, d = 512: outputs nope / rope, the compressor family's split) or Hadamard
        + FP4 qdq (indexer, d = 128: output out), fp32. Oracle `postprocess`, low-precision reference
        `postprocess_lowprec` (every step in bf16).

Kernels: kernels/compressor_decode/decode.py (PushKernel, PostKernel), built on the compressor
family's EntryKernel (online softmax, norm, RoPE, FP8 qdq).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from dsv4bench.core.torch_impls import register_torch_baselines
from kernels.common import compile_kernel, fake_rowmajor
from kernels.compressor.family import CompressorFamily, split
from kernels.compressor_decode import serves as served
from kernels.compressor_decode.decode import PostKernel, PushKernel
from kernels.rope.rotate import ROPE_DIM, rope_rows
from oracles.compressor import CompressorState, overlaps, postprocess, postprocess_lowprec
from oracles.norm import NORM_EPS
from oracles.rope import COMPRESSED_ROPE, rope_freqs
from sweeps import compressor_decode as space


def width(case: Case) -> int:
    """The projection width coff·d (§5.1)."""
    return case["d"] * (2 if overlaps(case["m"]) else 1)


def slots(case: Case) -> int:
    """The decode state's slots coff·m (§5.7)."""
    return case["m"] * (2 if overlaps(case["m"]) else 1)


def emits(case: Case) -> bool:
    """A push whose token completes a block."""
    return (case["t"] + 1) % case["m"] == 0


class CompressorDecodeFamily(Family):
    name = "compressor_decode"
    description = ("decode-time compressor: push a token into the fp32 CSA/HCA state, pooling the entry a block "
                   "completes (§5.7); post-process given entries: norm, RoPE(s·m), FP8 NoPE or Hadamard+FP4 (§5.5)")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/compressor_decode/serves.py)
    options = {
        "op": Option("op", "push (a token into the state; the raw entry when a block completes) or post "
                     "(post-process given raw entries)", choices=("push", "post"), names=True),
        "ratio": Option("m", "compression ratio: 4 = CSA and the indexer's (overlapping windows), 128 = HCA",
                        "tokens per entry", (4, 128)),
        "rows": Option("b", "sequences (push) or entries (post)", "rows"),
        "width": Option("d", "entry width: 512 the main compressor, 128 the indexer's", "elements"),
    }
    nope_tolerance = CompressorFamily.nope_tolerance  # the FP8 NoPE round trip (kernels/compressor/family.py)
    # The indexer's FP4 round trip: a flip moves a value by one e2m1 step (up to a third of it); the bf16
    # reference flips a few in a hundred (rel L2 ~3.5e-2 over 32-128 entries), the L2 bound allows more.
    fp4_tolerance = Tolerance(ratio=2.0, rel_l2=6e-2)

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        if case["op"] == "post" and case["indexer"]:
            return self.fp4_tolerance
        return self.nope_tolerance if output == "nope" else self.tolerance

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        return push_inputs(case, gen, device) if case["op"] == "push" else post_inputs(case, gen, device)

    def oracle(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "push":
            return push_eager(inputs["kv"], inputs["score"], inputs["kv_t"], inputs["score_t"], case["m"], case["t"])
        return post_outputs(case, postprocess(*post_args(case, inputs), indexer=case["indexer"], eps=NORM_EPS))

    def lowprec(self, case: Case, inputs: dict) -> dict:
        if case["op"] == "push":
            out = self.oracle(case, inputs)
            if "entry" in out:
                out["entry"] = out["entry"].bfloat16()
            return out
        return post_outputs(case, postprocess_lowprec(*post_args(case, inputs), indexer=case["indexer"], eps=NORM_EPS))

    def alloc_outputs(self, case: Case, device: str) -> dict:
        if case["op"] == "push":
            state = (case["b"], slots(case), width(case))
            out = {"kv": torch.empty(state, device=device), "score": torch.empty(state, device=device)}
            if emits(case):
                out["entry"] = torch.empty(case["b"], case["d"], device=device)
            return out
        return {"out": torch.empty(case["b"], case["d"], device=device)}

    def cost(self, case: Case) -> Cost:
        """push: read the token, write its slot; at a block's end read the candidates (HCA the m slots;
        CSA the own block's both halves and the previous block's a-halves), write the shifted block
        (CSA) and the entry. post: read the entry and its table row, write it."""
        b, d, m = case["b"], case["d"], case["m"]
        if case["op"] == "post":
            return Cost(flops=float(b * d * (20 + (14 if case["indexer"] else 0))),
                        bytes=float(b * (2 * d * 4 + ROPE_DIM * 4) + d * 2))
        w = width(case)
        moved, flops = b * w * 4 * 2 * 2, 0  # kv + score: read the token, write its slot
        if emits(case):
            cands = 2 * m if overlaps(m) else m
            moved += b * cands * d * 4 * 2 + b * d * 4  # the candidates, the entry
            if overlaps(m):
                moved += b * m * d * 4 * 2 + b * m * w * 4 * 2  # the own block's a-halves, the shift's writes
            flops = b * cands * d * 8
        return Cost(flops=float(flops), bytes=float(moved))


class CompressorDecodeCuteDSL(Impl):
    family, name, backend = "compressor_decode", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if not case["b"]:
            return "no row"
        try:
            kernel_for(case)
        except ValueError as e:
            return str(e)
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        if case["op"] == "push":
            return (self.family, self.name, arch, "push", case["m"], case["d"])
        return (self.family, self.name, arch, "post", case["d"], case["indexer"], NORM_EPS)

    def compile(self, case: Case, arch: str):
        return compile_kernel(kernel_for(case), *fake_args(case), arch=arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        if case["op"] == "push":  # the kernel updates the state in place: on a copy, the inputs stay as made
            out["kv"].copy_(inputs["kv"])
            out["score"].copy_(inputs["score"])
            entry = out["entry"] if emits(case) else torch.empty(case["b"], case["d"], device=out["kv"].device)
            compiled(out["kv"], out["score"], inputs["kv_t"], inputs["score_t"], entry, case["t"])
            return out
        compiled(inputs["c"], inputs["norm_w"], inputs["table"], out["out"])
        return post_outputs(case, out["out"])


def kernel_for(case: Case):
    if case["op"] == "push":
        return PushKernel(case["m"], case["d"])
    return PostKernel(case["d"], NORM_EPS, case["indexer"])


def fake_args(case: Case) -> tuple:
    """Fake tensors of a push (state, token, entry, t) or a post (entries, norm weight, table rows, out)."""
    d, b = case["d"], cute.sym_int()
    if case["op"] == "push":
        w, n = width(case), slots(case)
        return (fake_rowmajor("fp32", (b, n, w)), fake_rowmajor("fp32", (b, n, w)), fake_rowmajor("fp32", (b, w)),
                fake_rowmajor("fp32", (b, w)), fake_rowmajor("fp32", (b, d)), cutlass.Int32(0))
    return (fake_rowmajor("fp32", (b, d)), fake_rowmajor("bf16", (d,), 8), fake_rowmajor("fp32", (b, ROPE_DIM)),
            fake_rowmajor("fp32", (b, d)))


def push_inputs(case: Case, gen: torch.Generator, device: str) -> dict:
    """A state as the reference holds it before token t (random slots; for CSA at block 0 the absent
    previous block: kv 0, score −inf) and the token's projections."""
    b, m, w = case["b"], case["m"], width(case)
    kv = torch.randn(b, slots(case), w, generator=gen)
    score = 2.0 * torch.randn(b, slots(case), w, generator=gen) + 0.5
    if overlaps(m) and case["t"] < m:
        kv[:, :m], score[:, :m] = 0.0, float("-inf")
    out = {"kv": kv, "score": score, "kv_t": torch.randn(b, w, generator=gen),
           "score_t": 2.0 * torch.randn(b, w, generator=gen) + 0.5}
    return {k: v.to(device) for k, v in out.items()}


def push_eager(kv, score, kv_t, score_t, m: int, t: int) -> dict:
    """The reference's push on a copy of the state: {kv, score} and, at a block's last token, entry."""
    state = CompressorState.__new__(CompressorState)
    state.m, state.kv, state.score = m, kv.clone(), score.clone()
    entry = state.push(kv_t, score_t, t)
    out = {"kv": state.kv, "score": state.score}
    if entry is not None:
        out["entry"] = entry
    return out


def post_inputs(case: Case, gen: torch.Generator, device: str) -> dict:
    """B raw entries (pooled values: randn), the norm weight, entry ids anywhere in a 1M-token context
    (the first at 0: the identity rotation), and their RoPE table rows (position s·m)."""
    b, d, m = case["b"], case["d"], case["m"]
    ids = torch.randint(0, (1 << 20) // m, (b,), generator=gen)
    ids[0] = 0
    out = {"c": 2.0 * torch.randn(b, d, generator=gen),
           "norm_w": (1.0 + 0.3 * torch.randn(d, generator=gen)).bfloat16(), "ids": ids}
    out = {k: v.to(device) for k, v in out.items()}
    out["table"] = rope_rows(out["ids"] * m, rope_freqs(COMPRESSED_ROPE).to(device))
    return out


def post_args(case: Case, inputs: dict) -> tuple:
    """postprocess's positional arguments (c, norm_w, ids, m, freqs)."""
    freqs = rope_freqs(COMPRESSED_ROPE).to(inputs["c"].device)
    return inputs["c"], inputs["norm_w"], inputs["ids"], case["m"], freqs


def post_outputs(case: Case, out: torch.Tensor) -> dict:
    return {"out": out} if case["indexer"] else split(out)


def _eager(fns: dict, case: Case, inputs: dict) -> dict:
    if case["op"] == "push":
        return fns["push"](inputs["kv"], inputs["score"], inputs["kv_t"], inputs["score_t"], case["m"], case["t"])
    return post_outputs(case, fns["post"](*post_args(case, inputs), indexer=case["indexer"], eps=NORM_EPS))


register_family(CompressorDecodeFamily())
register_impl(CompressorDecodeCuteDSL())
# the reference's composition: CompressorState.push on a copy of the state; the bf16 post-processing
register_torch_baselines("compressor_decode", {"push": push_eager, "post": postprocess_lowprec}, _eager)
