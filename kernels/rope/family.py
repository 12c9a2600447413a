"""The RoPE family (spec §2.2): partial interleaved RoPE, forward / inverse, optionally fused with
the per-head weightless q RMSNorm (§4); case space, oracle pairing, cost model, implementations."""

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
from kernels.common import CUTE_DTYPES, TORCH_DTYPES, compile_kernel, fake_rowmajor
from kernels.rope.rope import RopeKernel
from kernels.rope.rotate import ROPE_DIM, rope_table
from oracles.norm import NORM_EPS, rmsnorm, rmsnorm_lowprec
from oracles.rope import (
    COMPRESSED_ROPE,
    SWA_ROPE,
    apply_rope,
    apply_rope_lowprec,
    rope_freqs,
)
from sweeps import rope as space

DECODE_MAX_POS = 1 << 17
TABLE_CONFIGS = {"yarn": COMPRESSED_ROPE, "swa": SWA_ROPE}


def freqs_for(case: Case) -> torch.Tensor:
    return rope_freqs(TABLE_CONFIGS[case["table"]])


def positions_for(case: Case, gen: torch.Generator) -> torch.Tensor:
    if case["pos"] == "prefill":
        return torch.arange(case["t"], dtype=torch.int32)
    return torch.randint(0, DECODE_MAX_POS, (case["t"],), generator=gen, dtype=torch.int32)


def rope_eager(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, norm: bool, inverse: bool):
    """What a torch user writes: gather the table rows, fp32 complex multiply, one cast back."""
    y = x.float()
    if norm:
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + NORM_EPS)
    rot = torch.view_as_complex(table[positions.long()].unflatten(-1, (-1, 2))).unsqueeze(-2)
    rot = rot.conj() if inverse else rot
    pairs = torch.view_as_complex(y[..., -ROPE_DIM:].unflatten(-1, (-1, 2)).contiguous())
    return torch.cat((y[..., :-ROPE_DIM], torch.view_as_real(pairs * rot).flatten(-2)), -1).to(x.dtype)


class RopeFamily(Family):
    name = "rope"
    description = "partial interleaved RoPE (last 64 dims), fwd/inverse, fused per-head q RMSNorm (§2.2, §4)"
    tolerance = Tolerance(ratio=2.0, rel_l2=1e-2)
    space = space
    options = {
        "op": Option("op", "q_norm_rope (per-head RMSNorm + RoPE), rope, or inverse (output side)",
                     choices=("q_norm_rope", "rope", "inverse"), names=True),
        "rows": Option("t", "tokens", "tokens"),
        "heads": Option("h", "heads per token (1 = the shared KV latent)", "heads"),
        "hd": Option("n", "head dim (RoPE rotates its last 64)", "elements"),
        "dtype": Option("dtype", "element type", choices=tuple(sorted(TORCH_DTYPES)), names=True),
    }

    def make_inputs(self, case: Case, gen: torch.Generator, device: str) -> dict:
        t, h, n, dt = case["t"], case["h"], case["n"], TORCH_DTYPES[case["dtype"]]
        x = (torch.randn(t, h, n, generator=gen) * 2.0 + 0.5).to(dt)
        positions = positions_for(case, gen)
        table = rope_table(freqs_for(case), int(positions.max()) + 1, device)
        return {"x": x.to(device), "positions": positions.to(device), "table": table}

    def _args(self, case: Case, inputs: dict):
        return inputs["positions"].long().unsqueeze(-1), freqs_for(case).to(inputs["x"].device)

    def oracle(self, case: Case, inputs: dict) -> dict:
        pos, freqs = self._args(case, inputs)
        # an fp32 kernel is judged against fp64 arithmetic on the same fp32 rotations (the table it is given): an
        # fp32 oracle would share its rounding, leaving one ulp (seed 5353 drew 3-ulp q_norm_rope rows, H200)
        wide = torch.float64 if case["dtype"] == "fp32" else None
        x = inputs["x"]
        if case["op"] == "q_norm_rope":
            x = rmsnorm(x, None, NORM_EPS, compute_dtype=wide or torch.float32)
        return {"out": apply_rope(x, pos, freqs, inverse=case["op"] == "inverse", compute=wide)}

    def lowprec(self, case: Case, inputs: dict) -> dict:
        pos, freqs = self._args(case, inputs)
        x = rmsnorm_lowprec(inputs["x"], None, NORM_EPS) if case["op"] == "q_norm_rope" else inputs["x"]
        return {"out": apply_rope_lowprec(x, pos, freqs, inverse=case["op"] == "inverse")}

    def alloc_outputs(self, case: Case, device: str) -> dict:
        return {"out": torch.empty(case["t"], case["h"], case["n"], dtype=TORCH_DTYPES[case["dtype"]], device=device)}

    def cost(self, case: Case) -> Cost:
        t, h, n = case["t"], case["h"], case["n"]
        es = TORCH_DTYPES[case["dtype"]].itemsize
        flops = t * h * (6 * ROPE_DIM // 2 * 2 + (3 * n if case["op"] == "q_norm_rope" else 0))
        # x in, out back, the positions and one table row per token (rows may repeat: an upper bound)
        return Cost(flops=float(flops), bytes=float(2 * t * h * n * es + t * (4 + 4 * ROPE_DIM)))


def _kernel(case: Case) -> RopeKernel:
    return RopeKernel(CUTE_DTYPES[case["dtype"]], case["n"], case["op"] == "q_norm_rope", case["op"] == "inverse",
                      NORM_EPS)


class RopeCuteDSL(Impl):
    family, name, backend = "rope", "cutedsl", "cutedsl"
    compiles = True

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            _kernel(case)
        except ValueError as e:
            return str(e)
        return None

    def compile_key(self, case: Case, arch: str) -> tuple:
        return (self.family, self.name, arch, case["dtype"], case["n"], case["op"], NORM_EPS)

    def compile(self, case: Case, arch: str):
        rows, tokens, n_pos = cute.sym_int(), cute.sym_int(), cute.sym_int()
        x, o = fake_rowmajor(case["dtype"], (rows, case["n"])), fake_rowmajor(case["dtype"], (rows, case["n"]))
        pos = make_fake_compact_tensor(cutlass.Int32, (tokens,), stride_order=(0,), assumed_align=4)
        tab = make_fake_compact_tensor(cutlass.Float32, (n_pos, ROPE_DIM), stride_order=(1, 0), assumed_align=16)
        return compile_kernel(_kernel(case), x, pos, tab, o, cutlass.Int32(1), arch=arch)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        n = case["n"]
        compiled(inputs["x"].view(-1, n), inputs["positions"], inputs["table"], out["out"].view(-1, n), case["h"])
        return out


register_family(RopeFamily())
register_impl(RopeCuteDSL())
register_torch_baselines("rope", rope_eager, lambda fn, case, inputs: {"out": fn(
    inputs["x"], inputs["positions"], inputs["table"], case["op"] == "q_norm_rope", case["op"] == "inverse")})
