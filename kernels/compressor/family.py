"""The compressor family (spec §5): CSA / HCA softmax pooling of the compressor projections, then
RMSNorm, RoPE at position s·m and FP8 qdq of the NoPE dims; oracle pairing, cost, impls.

Inputs are the fp32 projections of §5.2 (kv = wkv(x), score = wgate(x) + ape[t mod m]) for B
sequences of S tokens from position 0; the output is the ⌊S/m⌋ cache entries per sequence, bf16.

Case parameter `indexer` (absent = False: the main compressor's cases, ids and compile keys as before):
the indexer's compressor (§6: m = 4, d = 128), whose post-processing ends in Hadamard_128 + FP4 qdq
(§5.5) instead of the FP8 NoPE qdq; one output `out` (the main compressor's: `nope` / `rope`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
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
from kernels.common import compile_kernel, fake_rowmajor
from kernels.compressor import serves as served
from kernels.compressor.compressor import CsaKernel
from kernels.compressor.hca import SPLITS as HCA_SPLITS
from kernels.compressor.hca import STATE, HcaKernel, counters
from kernels.compressor.indexer import IndexerCsaKernel
from kernels.rope.rotate import ROPE_DIM, rope_table
from oracles.compressor import (
    block_candidates,
    num_entries,
    overlaps,
    pool,
    postprocess,
    postprocess_lowprec,
)
from oracles.norm import NORM_EPS
from oracles.rope import COMPRESSED_ROPE, rope_freqs
from sweeps import compressor as space


def width(case: Case) -> int:
    """The projection width coff·d (§5.1)."""
    return case["d"] * (2 if overlaps(case["m"]) else 1)


def entries(case: Case) -> int:
    return num_entries(case["s"], case["m"])


def indexed(case: Case) -> bool:
    """The indexer's compressor (Hadamard + FP4 post-processing); absent from the main compressor's cases."""
    return bool(case.get("indexer", False))


def outputs(case: Case, out: torch.Tensor) -> dict:
    """The indexer's entry as one output, the main compressor's split (nope / rope)."""
    return {"out": out} if indexed(case) else split(out)


def split(out: torch.Tensor) -> dict:
    """The entry as two outputs: the FP8-qdq'd NoPE dims and the bf16 RoPE dims (own tolerances)."""
    return {"nope": out[..., :-ROPE_DIM], "rope": out[..., -ROPE_DIM:]}


def compress_eager(kv, score, norm_w, m: int, freqs, indexer: bool = False):
    """The reference's torch composition: overlap transform, per-channel softmax pooling, then the
    bf16 post-processing (norm, RoPE, FP8 NoPE qdq; the indexer's: Hadamard + FP4 qdq) of §5.5."""
    c = pool(*block_candidates(kv, score, m))
    ids = torch.arange(c.shape[1], device=c.device)
    return postprocess_lowprec(c, norm_w, ids, m, freqs, indexer=indexer)


class CompressorFamily(Family):
    name = "compressor"
    description = ("CSA (m=4, overlap) / HCA (m=128) pooling + RMSNorm + RoPE(s·m) + FP8 NoPE qdq (§5); "
                   "indexer=True: the indexer's compressor (m=4, d=128) with Hadamard + FP4 qdq")
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    serves = served.OPS  # the model op it serves (kernels/compressor/serves.py)
    options = {
        "ratio": Option("m", "compression ratio: 4 = CSA (overlapping windows), 128 = HCA", "tokens per entry", (4, 128)),
        "rows": Option("s", "tokens compressed per sequence", "tokens"),
        "width": Option("d", "head dim of an entry", "elements"),
    }
    # e4m3 keeps 3 mantissa bits: a value on the other side of a rounding midpoint moves by one
    # code (6-12 %). The bf16 reference flips ~1 in 16 NoPE values (rel L2 ~1.5e-2); the max rule
    # scales with its flips, the L2 bound of the NoPE part allows twice that.
    nope_tolerance = Tolerance(ratio=2.0, rel_l2=3e-2)
    # The indexer's FP4 round trip (the value of compressor_decode's post op, whose entries are the same
    # post-processing): a flip moves a value by one e2m1 step (up to a third of it); the bf16 reference
    # flips a few in a hundred (rel L2 ~3.5e-2), the L2 bound allows more.
    fp4_tolerance = Tolerance(ratio=2.0, rel_l2=6e-2)

    def tolerance_for(self, case: Case, output: str) -> Tolerance:
        if indexed(case):
            return self.fp4_tolerance
        return self.nope_tolerance if output == "nope" else self.tolerance

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        b, s, d, w = case["b"], case["s"], case["d"], width(case)
        inputs = {
            "kv": torch.randn(b, s, w, generator=gen),
            "score": 2.0 * torch.randn(b, s, w, generator=gen) + 0.5,
            "norm_w": (1.0 + 0.3 * torch.randn(d, generator=gen)).bfloat16(),
        }
        inputs = {k: v.to(device) for k, v in inputs.items()}
        inputs["table"] = rope_table(rope_freqs(COMPRESSED_ROPE), max(1, (entries(case) - 1) * case["m"] + 1), device)
        return inputs

    def _raw(self, case: Case, inputs: dict):
        c = pool(*block_candidates(inputs["kv"], inputs["score"], case["m"]))
        ids = torch.arange(c.shape[1], device=c.device)
        return c, ids, rope_freqs(COMPRESSED_ROPE).to(c.device)

    def oracle(self, case: Case, inputs: dict) -> dict:
        c, ids, freqs = self._raw(case, inputs)
        return outputs(case, postprocess(c, inputs["norm_w"], ids, case["m"], freqs, indexer=indexed(case),
                                         eps=NORM_EPS))

    def lowprec(self, case: Case, inputs: dict) -> dict:
        c, ids, freqs = self._raw(case, inputs)
        return outputs(case, postprocess_lowprec(c, inputs["norm_w"], ids, case["m"], freqs, indexer=indexed(case),
                                                 eps=NORM_EPS))

    def alloc_outputs(self, case: Case, device: str) -> dict:
        return {"out": torch.empty(case["b"], entries(case), case["d"], dtype=torch.bfloat16, device=device)}

    def cost(self, case: Case) -> Cost:
        b, d, m, e = case["b"], case["d"], case["m"], entries(case)
        used = e * m  # tokens of complete blocks
        read = b * used * width(case) * 4 * 2  # kv + score, each element once
        cands = (2 * m) if overlaps(m) else m
        post = 20 + (14 if indexed(case) else 0)  # the indexer's Hadamard butterfly (7 steps) and FP4 qdq
        return Cost(flops=float(b * e * d * (8 * cands + post)),
                    bytes=float(read + b * e * d * 2 + d * 2 + e * 4 * ROPE_DIM))


class CompressorCuteDSL(Impl):
    family, name, backend = "compressor", "cutedsl", "cutedsl"
    compiles = True
    hca: dict = {}  # HcaKernel's splits / groups: {} is the shipped choice (a declared variant sets its own)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            kernel_for(case)
        except ValueError as e:
            return str(e)
        return None if entries(case) else "no complete block"

    def compile_key(self, case: Case, arch: str) -> tuple:
        key = (self.family, self.name, arch, case["m"], case["d"], NORM_EPS)
        return (*key, "indexer") if indexed(case) else key  # the main compressor's keys as before

    def make_kernel(self, case: Case):
        """The kernel object to compile (a declared variant, kernels/compressor/variants.py, returns its own)."""
        return kernel_for(case, **self.hca)

    def compile(self, case: Case, arch: str):
        return compile_kernel(self.make_kernel(case), *fake_args(case, self.hca.get("splits")), arch=arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        args = (inputs["kv"], inputs["score"], inputs["norm_w"], inputs["table"], out["out"])
        if overlaps(case["m"]):
            compiled(*args)
        else:
            compiled(*args, *hca_scratch(case, out["out"].device, self.hca.get("splits")))
        return outputs(case, out["out"])


def kernel_for(case: Case, **hca):
    """The CSA kernel for m = 4, the split HCA kernel otherwise (`hca`: its splits / groups); for the
    indexer's compressor the CSA kernel with Hadamard + FP4 (kernels/compressor/indexer.py)."""
    if indexed(case):
        return IndexerCsaKernel(case["m"], case["d"], NORM_EPS)
    if overlaps(case["m"]):
        return CsaKernel(case["m"], case["d"], NORM_EPS)
    return HcaKernel(case["m"], case["d"], NORM_EPS, **hca)


def fake_args(case: Case, splits: int | None = None) -> tuple:
    """Fake tensors of a launch (sizes symbolic but the entry width); HCA adds its scratch and counters."""
    d, w = case["d"], width(case)
    b, s, e, p = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    fake = (fake_rowmajor("fp32", (b, s, w)), fake_rowmajor("fp32", (b, s, w)), fake_rowmajor("bf16", (d,), 8),
            fake_rowmajor("fp32", (p, ROPE_DIM)), fake_rowmajor("bf16", (b, e, d), 8))
    if overlaps(case["m"]):
        return fake
    return (*fake, fake_rowmajor("fp32", (b, e, splits or HCA_SPLITS, STATE, d)),
            make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=4))


def hca_scratch(case: Case, device, splits: int | None = None) -> tuple:
    """The HCA merge's partial states (fresh each call) and the persistent entry counters."""
    b, e = case["b"], entries(case)
    part = torch.empty(b, e, splits or HCA_SPLITS, STATE, case["d"], dtype=torch.float32, device=device)
    return part, counters(b * e, device)


def _eager_args(case: Case, inputs: dict):
    freqs = rope_freqs(COMPRESSED_ROPE).to(inputs["kv"].device)
    return inputs["kv"], inputs["score"], inputs["norm_w"], case["m"], freqs


def _eager(fn, case: Case, inputs: dict) -> dict:
    if indexed(case):
        return outputs(case, fn(*_eager_args(case, inputs), indexer=True))
    return split(fn(*_eager_args(case, inputs)))


register_family(CompressorFamily())
register_impl(CompressorCuteDSL())
register_torch_baselines("compressor", compress_eager, _eager)

# Declared variants (knock-outs and ablations, run only when named: `--impl cutedsl:<variant>`).
# They subclass CompressorCuteDSL, so they are imported last; variants.py registers them (register_impl).
from kernels.compressor import variants  # noqa: E402,F401
