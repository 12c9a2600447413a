"""The indexer family: the lightning indexer's logits (spec §6) over the FP8 indexer cache, DeepGEMM's
`fp8_mqa_logits` contract,

    I(t, s) = sum_h w[t, h] * ReLU(q[t, h] . kv[s] * sc[s])   for ks[t] <= s < ke[t], else -inf,

with q e4m3 [T, 64, 128], kv e4m3 [S_kv, 128] with one fp32 scale per key (sc [S_kv]), w fp32
[T, 64], ks / ke int32 [T] (per-query [start, end) key ranges; DSV4's causal mask
s < floor((t+1)/4) is ks = 0, ke = floor((t+1)/4)), logits fp32 [T, S_kv]. Top-k comes later.

Oracle: oracles/indexer.py `indexer_scores` in fp32 on the dequantised keys kv * sc, masked to the
ranges (kernels/indexer/glue.py). Low-precision reference: the reference's bf16 path,
`indexer_scores_lowprec`, on the same values (q exact in bf16, keys and weights rounded to bf16).

Masked entries are -inf in the oracle and must be -inf in the output: the harness's float rule
(core/compare.py) fails any other value where the oracle is +-inf or NaN, and
tests/indexer/test_indexer_gpu.py checks the mask exactly as well.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from kernels.indexer import peers
from kernels.indexer.config import choose_config
from kernels.indexer.glue import (HEAD_DIM, HEADS, causal_ranges, check_operands, compile_logits, lowprec_of,
                                  make_inputs, oracle_of, run_logits, varlen_ranges)
from kernels.indexer.logits_sm90 import LogitsConfig
from sweeps import indexer as space

RELATIVE_MIN_LOGITS = 64
SM90_ONLY = ("the SM90 kernel is built on warpgroup MMA (wgmma) and Hopper TMA descriptors; sm_100a "
             "has no wgmma (it needs a tcgen05/TMEM kernel), so it is not compiled for sm_100a")


def case_ranges(p: dict, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A case's per-query key ranges (ks, ke), int32 [T] (sweeps/indexer.py says what each mask means)."""
    if p["mask"] == "varlen":
        ks, ke, s_kv = varlen_ranges(p["lens"], device)
        assert s_kv == p["s_kv"], (s_kv, p)
        return ks, ke
    return causal_ranges(p["t"], p["s_kv"], p.get("p0", 0), device)


class IndexerFamily(Family):
    name = "indexer"
    description = ("lightning indexer logits sum_h w*ReLU(q.k*scale) over the FP8 indexer cache (64 heads x 128), "
                   "causal / per-query key ranges, fp32 out (DeepGEMM fp8_mqa_logits)")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    options = {
        "tokens": Option("t", "query tokens T", "tokens"),
        "entries": Option("s_kv", "compressed indexer entries S_kv (keys)", "entries"),
        "mask": Option("mask", "key ranges: causal (one sequence, queries at p0..p0+T-1) or varlen "
                       "(sequences packed along T and S_kv)", choices=("causal", "varlen"), names=True),
    }

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        """The relative-L2 rule needs enough independent logits: each logit is a signed sum over heads
        (w has either sign), and with a handful of them cancellation alone puts the bf16 reference
        itself past 1e-2 (10-20% of seeds at 1-3 logits; at 64 or more its worst over 200 seeds was
        0.0075). Below RELATIVE_MIN_LOGITS only the max-error rule (2x the bf16 reference's error +
        one fp32 ulp at the output's magnitude) applies."""
        if space.independent_logits(case.params) < RELATIVE_MIN_LOGITS:
            return Tolerance(ratio=self.tolerance.ratio, rel_l2=float("inf"))
        return self.tolerance

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        ks, ke = case_ranges(case.params)
        return make_inputs(case["t"], case["s_kv"], ks, ke, seed, device, bool(case.get("ties", False)))

    def oracle(self, case: Case, inputs: dict) -> dict:
        return {"logits": oracle_of(**inputs)}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        return {"logits": lowprec_of(**inputs)}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        return {"logits": torch.empty(case["t"], case["s_kv"], dtype=torch.float32, device=device)}

    def cost(self, case: Case) -> Cost:
        """flops: 2 * 64 * 128 per visible (t, s) pair (the causal mask skips about half); bytes: q, the
        keys and scales, w, ks / ke once, and the whole fp32 output (masked entries are written)."""
        t, s_kv = case["t"], case["s_kv"]
        pairs = space.visible_pairs(case.params)
        return Cost(flops=2.0 * HEADS * HEAD_DIM * pairs,
                    bytes=float(t * HEADS * HEAD_DIM + s_kv * (HEAD_DIM + 4) + t * (HEADS * 4 + 8) + 4 * t * s_kv))


class IndexerCuteDSL(Impl):
    family, name, backend = "indexer", "cutedsl", "cutedsl"
    archs = ("sm_90a",)
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if arch not in (None, "sm_90a"):
            return SM90_ONLY
        return None

    def config(self, case: Case) -> LogitsConfig:
        """The configuration of the case (the seam of the declared variants)."""
        return choose_config(case["t"], case["s_kv"])

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, "cutedsl", arch, self.config(case))

    def compile(self, case: Case, arch: str):
        if arch != "sm_90a":
            raise ValueError(SM90_ONLY)
        return compile_logits(self.config(case), arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        check_operands(**inputs, out=out["logits"])
        run_logits(compiled, self.config(case), **inputs, out=out["logits"])
        return out


FAMILY = register_family(IndexerFamily())
for _impl in (IndexerCuteDSL(), peers.DeepGemm()):
    register_impl(_impl)
peers.register_torch_peers()


def fp8_mqa_logits(q: torch.Tensor, kv: torch.Tensor, sc: torch.Tensor, w: torch.Tensor, ks: torch.Tensor,
                   ke: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The op for model code (DeepGEMM's contract, bad input -> ValueError naming the tensor): fp32
    logits [T, S_kv], -inf outside ks <= s < ke. Compiled kernels are cached per configuration."""
    n_tok, s_kv = check_operands(q, kv, sc, w, ks, ke, out)
    cfg = choose_config(n_tok, s_kv)
    if cfg not in _COMPILED:
        _COMPILED[cfg] = compile_logits(cfg)
    out = torch.empty(n_tok, s_kv, dtype=torch.float32, device=q.device) if out is None else out
    return run_logits(_COMPILED[cfg], cfg, q, kv, sc, w, ks, ke, out)


_COMPILED: dict = {}

# Declared variants (configuration ablations, run only when named: `--impl cutedsl:<name>`). They
# subclass IndexerCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.indexer import variants  # noqa: E402,F401
