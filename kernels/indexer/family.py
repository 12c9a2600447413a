"""The indexer family (spec §6), two ops (`op` of a case, sweeps/indexer.py):

logits (a case without `op`): the lightning indexer's logits over the FP8 indexer cache, DeepGEMM's
`fp8_mqa_logits` contract,

    I(t, s) = sum_h w[t, h] * ReLU(q[t, h] . kv[s] * sc[s])   for ks[t] <= s < ke[t], else -inf,

with q e4m3 [T, 64, 128], kv e4m3 [S_kv, 128] with one fp32 scale per key (sc [S_kv]), w fp32
[T, 64], ks / ke int32 [T] (per-query [start, end) key ranges; DSV4's causal mask
s < floor((t+1)/4) is ks = 0, ke = floor((t+1)/4)), logits fp32 [T, S_kv].

Oracle: oracles/indexer.py `indexer_scores` in fp32 on the dequantised keys kv * sc, masked to the
ranges (kernels/indexer/glue.py). Low-precision reference: the reference's bf16 path,
`indexer_scores_lowprec`, on the same values (q exact in bf16, keys and weights rounded to bf16).

Masked entries are -inf in the oracle and must be -inf in the output: the harness's float rule
(core/compare.py) fails any other value where the oracle is +-inf or NaN, and
tests/indexer/test_indexer_gpu.py checks the mask exactly as well.

decode: one query token per request over a paged FP8 cache, DeepGEMM's `fp8_paged_mqa_logits`
contract with next_n = 1 (kernels/indexer/decode_sm90.py, decode_glue.py: the page layout): q e4m3
[B, 64, 128], the fused cache uint8 [pages, 64, 1, 132], w fp32 [B, 64], lens int32 [B], table int32
[B, max_blocks], logits fp32 [B, W], -inf at s >= lens[b]. Oracle: `oracle_of` on each request's
gathered keys (decode_glue.decode_reference); low-precision reference: `lowprec_of` the same way.

topk: the k largest valid entries of each row of fp32 logits [T, S_kv] (-inf outside the row's
entries), int32 indices [T, min(k, S_kv)] (kernels/indexer/topk_sm90.py: ascending index order, then
-1 slots). Oracle: oracles/indexer.py `indexer_topk` (ties to the lower index); the kernel is exact, so
it is the low-precision reference too. Compared as index sets per row; cost: bytes only.

select: the fused decode path (kernels/indexer/select_sm90.py): decode's operands and k -> int32
[B, min(k, W)], each request's top-k of the logits decode would write, in top-k's layout, without the
logits in DRAM. Oracle: `indexer_topk` of decode's oracle logits. The kernel ranks its own logits, so
its set may differ from the oracle's by near-ties: indices whose oracle logits lie within 2x the bf16
reference's largest logit error of the row's threshold (core/compare.py `_near_ties`); the GPU tests
hold it to the unfused pair's answer exactly.
"""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl, Option, Tolerance, register_family, register_impl
from kernels.indexer import peers
from kernels.indexer import serves as served
from kernels.indexer.config import choose_config
from kernels.indexer.decode_glue import PAGE, check_decode, compile_decode, decode_reference, make_decode_inputs, run_decode
from kernels.indexer.decode_sm90 import DecodeConfig
from kernels.indexer.glue import (HEAD_DIM, HEADS, causal_ranges, check_operands, compile_logits, lowprec_of,
                                  make_inputs, oracle_of, run_logits, topk_logits, varlen_ranges)
from kernels.indexer.logits_sm90 import LogitsConfig
from kernels.indexer.select_glue import check_select, compile_select, select
from kernels.indexer.topk_glue import check_topk_args, compile_topk, out_width, run_topk
from oracles.indexer import indexer_topk
from sweeps import indexer as space
from sweeps.indexer import decode_lens, is_decode, is_paged, is_select, is_topk

RELATIVE_MIN_LOGITS = 64
SM90_ONLY = ("the SM90 kernel is built on warpgroup MMA (wgmma) and Hopper TMA descriptors; sm_100a "
             "has no wgmma (it needs a tcgen05/TMEM kernel), so it is not compiled for sm_100a")


def case_ranges(p: dict, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A case's per-query key ranges (ks, ke), int32 [T] (sweeps/indexer.py says what each mask means)."""
    if p["mask"] == "varlen":
        ks, ke, s_kv = varlen_ranges(p["lens"], device)
        assert s_kv == p["s_kv"], (s_kv, p)
        return ks, ke
    if p["mask"] in ("full", "ragged"):
        ke = torch.full((p["t"],), p["s_kv"]) if p["mask"] == "full" else torch.tensor(p["lens"])
        return torch.zeros(p["t"], dtype=torch.int32, device=device), ke.to(torch.int32).to(device)
    return causal_ranges(p["t"], p["s_kv"], p.get("p0", 0), device)


class IndexerFamily(Family):
    name = "indexer"
    description = ("lightning indexer logits sum_h w*ReLU(q.k*scale) over the FP8 indexer cache (64 heads x 128), "
                   "causal / per-query key ranges, fp32 out (DeepGEMM fp8_mqa_logits); decode over a paged cache "
                   "(fp8_paged_mqa_logits); top-k of each row's valid logits, int32 indices; the fused decode "
                   "logits -> top-k")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model ops it serves (kernels/indexer/serves.py)
    options = {
        "op": Option("op", "logits (prefill), decode (one token a request over a paged cache), the top-k "
                     "selection over logits, or select (decode's top-k, fused)",
                     choices=("logits", "topk", "decode", "select"), names=True, default="logits"),
        "tokens": Option("t", "query tokens T (top-k: rows; decode: requests B)", "tokens"),
        "entries": Option("s_kv", "compressed indexer entries S_kv (keys; top-k: row length; decode: the longest "
                          "request's)", "entries"),
        "k": Option("k", "top-k, select: entries selected per row (512 Flash, 1024 Pro)", "entries"),
        "mask": Option("mask", "which entries each row sees: causal (one sequence, queries at p0..p0+T-1), varlen "
                       "(sequences packed along T and S_kv), full (all: decode) or ragged (top-k, decode: a length "
                       "per row)", choices=("causal", "varlen", "full", "ragged"), names=True),
    }

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        """The relative-L2 rule needs enough independent logits: each logit is a signed sum over heads
        (w has either sign), and with a handful of them cancellation alone puts the bf16 reference
        itself past 1e-2 (10-20% of seeds at 1-3 logits; at 64 or more its worst over 200 seeds was
        0.0075). Below RELATIVE_MIN_LOGITS only the max-error rule (2x the bf16 reference's error +
        one fp32 ulp at the output's magnitude) applies. Top-k indices compare as sets per row; the
        fused select's up to near-ties of its oracle logits (the `logits` entry, not an output)."""
        if is_topk(case.params):
            return Tolerance(index_set=True)
        if is_select(case.params):
            return Tolerance(aux=True) if output == "logits" else Tolerance(index_set=True, scores="logits", near=2.0)
        if space.independent_logits(case.params) < RELATIVE_MIN_LOGITS:
            return Tolerance(ratio=self.tolerance.ratio, rel_l2=float("inf"))
        return self.tolerance

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        if is_paged(case.params):  # made on `device` (up to a 4.4 GB cache)
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
            return make_decode_inputs(decode_lens(case.params), case["s_kv"], case["table"], seed, device,
                                      case.get("pad", 0), case.get("keys", "randn"))
        ks, ke = case_ranges(case.params)
        if is_topk(case.params):
            return {"logits": topk_logits(ks, ke, case["s_kv"], case["values"], gen).to(device)}
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        return make_inputs(case["t"], case["s_kv"], ks, ke, seed, device, bool(case.get("ties", False)))

    def oracle(self, case: Case, inputs: dict) -> dict:
        if is_topk(case.params):
            return {"indices": indexer_topk(inputs["logits"], case["k"]).to(torch.int32)}
        if is_paged(case.params):
            return self._paged(case, decode_reference(**inputs, width=case["s_kv"]))
        return {"logits": oracle_of(**inputs)}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        if is_topk(case.params):  # a selection in fp32, the kernel's precision: the oracle itself
            return self.oracle(case, inputs)
        if is_paged(case.params):
            return self._paged(case, decode_reference(**inputs, width=case["s_kv"], lowprec=True))
        return {"logits": lowprec_of(**inputs)}

    @staticmethod
    def _paged(case: Case, logits: torch.Tensor) -> dict:
        """A paged case's reference from its logits: decode's, or select's indices (and the logits)."""
        if is_select(case.params):
            return {"indices": indexer_topk(logits, case["k"]).to(torch.int32), "logits": logits}
        return {"logits": logits}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        t, s_kv = case["t"], case["s_kv"]
        if is_topk(case.params) or is_select(case.params):
            return {"indices": torch.empty(t, out_width(s_kv, case["k"]), dtype=torch.int32, device=device)}
        return {"logits": torch.empty(t, s_kv, dtype=torch.float32, device=device)}

    def cost(self, case: Case) -> Cost:
        """Logits: flops 2 * 64 * 128 per visible (t, s) pair (the causal mask skips about half); bytes:
        q, the keys and scales, w, ks / ke once, and the whole fp32 output (masked entries are written).
        Decode: flops the same per (request, key); bytes 132 per key a request reads (codes and scale),
        its page id, q, w and the length, and the whole fp32 output.
        Top-k: no flops; bytes: the fp32 logits read once, the int32 indices written.
        Select: decode's flops; decode's bytes with the int32 indices written instead of the logits."""
        t, s_kv = case["t"], case["s_kv"]
        if is_paged(case.params):
            keys = space.visible_pairs(case.params)
            pages = sum(-(-min(n, s_kv) // PAGE) for n in decode_lens(case.params))
            out = 4 * t * (out_width(s_kv, case["k"]) if is_select(case.params) else s_kv)
            return Cost(flops=2.0 * HEADS * HEAD_DIM * keys,
                        bytes=float(keys * (HEAD_DIM + 4) + 4 * pages + t * (HEADS * HEAD_DIM + HEADS * 4 + 4) + out))
        if is_topk(case.params):
            return Cost(flops=0.0, bytes=float(4 * t * s_kv + 4 * t * out_width(s_kv, case["k"])))
        pairs = space.visible_pairs(case.params)
        return Cost(flops=2.0 * HEADS * HEAD_DIM * pairs,
                    bytes=float(t * HEADS * HEAD_DIM + s_kv * (HEAD_DIM + 4) + t * (HEADS * 4 + 8) + 4 * t * s_kv))


class IndexerCuteDSL(Impl):
    """The logits kernel, for a decode case the paged decode kernel (kernels/indexer/decode_sm90.py),
    for a select case the fused path (kernels/indexer/select_glue.py), for a top-k case the top-k
    kernel (kernels/indexer/topk_glue.py), which has no wgmma: it is taken on sm_100a too."""

    family, name, backend = "indexer", "cutedsl", "cutedsl"
    archs = ("sm_90a",)
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if arch not in (None, "sm_90a") and not is_topk(case.params):
            return SM90_ONLY
        return None

    def config(self, case: Case) -> LogitsConfig:
        """The configuration of the case (the seam of the declared variants)."""
        return choose_config(case["t"], case["s_kv"])

    def compile_key(self, case: Case, arch: str) -> tuple:
        if is_topk(case.params):
            return (self.family, "topk", arch)
        if is_paged(case.params):
            return (self.family, case["op"], arch, DecodeConfig())
        return (self.family, "cutedsl", arch, self.config(case))

    def compile(self, case: Case, arch: str):
        if is_topk(case.params):
            return compile_topk(arch)
        if arch != "sm_90a":
            raise ValueError(SM90_ONLY)
        if is_decode(case.params):
            return compile_decode(DecodeConfig(), arch)
        if is_select(case.params):
            return compile_select(DecodeConfig(), arch)
        return compile_logits(self.config(case), arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        if is_topk(case.params):
            check_topk_args(inputs["logits"], case["k"], out["indices"])
            run_topk(compiled, inputs["logits"], out["indices"])
            return out
        if is_decode(case.params):
            check_decode(**inputs, out=out["logits"])
            run_decode(compiled, **inputs, out=out["logits"])
            return out
        if is_select(case.params):
            check_select(**inputs, width=case["s_kv"], k=case["k"], out=out["indices"])
            select(compiled, **inputs, width=case["s_kv"], out=out["indices"])
            return out
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
