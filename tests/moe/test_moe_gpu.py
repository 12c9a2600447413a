"""The moe family on a GPU (marked `gpu`: skipped without CUDA). Every case goes through the one
evaluation path (`gpu_check`): poisoned outputs, canaries, inputs unchanged, the tolerance rule.

- dispatch and combine (ours) on every production case and hypothesis draws (every load, both layouts);
- dispatch's edge cases: an expert with no tokens, a token routed twice to one expert, ids outside
  [0, E), a masked count past max_m (ValueError from the op), and its output feeding combine;
- the layer's peers (DeepGEMM grouped FP8, torch._grouped_mm, the eager loop) on decode and prefill.
"""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from kernels.moe.family import MoeGemvFine
from kernels.moe.gemv_layer import compile_gemv_layer
from kernels.moe.glue import combine, dispatch
from kernels.moe.inputs import counts
from oracles.moe import contiguous_rows, dispatch_layout, gather_quant
from oracles.quant import fp8_qdq
from sweeps import moe as space

pytestmark = pytest.mark.gpu

FAMILY = get_family("moe")
OURS = [c for c in FAMILY.cases(SweepOptions(examples=30, seed=11)) if c["op"] != "layer"]
LAYER = [Case("moe", space.case("layer", model, t, load)) for model in space.MODELS
         for t, load in ((1, "uniform"), (64, "hot"), (256, "uniform"), (4096, "zipf"))]
LAYER += [c for c in FAMILY.cases(SweepOptions(examples=30, seed=11, grid=False)) if c["op"] == "layer"][:6]


@pytest.mark.parametrize("case", OURS, ids=[c.id for c in OURS])
def test_ours_matches_the_reference(case, gpu_check):
    gpu_check(case)


@pytest.mark.parametrize("impl", ["torch", "torch_grouped_mm", "deepgemm"])
@pytest.mark.parametrize("case", LAYER, ids=[c.id for c in LAYER])
def test_layer_peers_pass_the_rule(case, impl, gpu_check):
    peer = get_impl("moe", impl)
    if peer.available() or peer.supports(case, None):
        pytest.skip(peer.available() or peer.supports(case, None))
    gpu_check(case, peer)


@pytest.mark.parametrize("max_m", [None, 8])
def test_dispatch_edge_routings(max_m):
    """Expert 3 gets nothing, token 0 hits expert 1 twice, id 9 and -1 are not routed (E = 8)."""
    idx = torch.tensor([[1, 1, 0, 2, 4, 5], [0, 2, 9, 4, 5, 6], [7, 6, 5, -1, 2, 0]], dtype=torch.int32, device="cuda")
    w = torch.rand(3, 6, device="cuda")
    x = torch.randn(3, 256, device="cuda").bfloat16()
    out = dispatch(x, idx, w, 8, max_m)
    rows = 8 * max_m if max_m else contiguous_rows(3, 6, 8)
    want = dispatch_layout(idx, w, 8, rows, max_m)
    codes, scales = gather_quant(x, want["src"], 8 if max_m else 1)
    for name, ref in {**want, "codes": codes, "scales": scales}.items():
        assert torch.equal(out[name], ref), name
    assert out["counts"][3] == 0 and (out["pos"][0, :2] >= 0).all() and out["pos"][1, 2] == -1


@pytest.mark.parametrize("d, t", [(256, 4), (4096, 4), (7168, 64)])
def test_fused_dispatch_matches_the_two_launches_on_the_rows_the_layer_reads(d, t):
    """`cutedsl:fused-dispatch` (and v29's, loading x before the rank: early_x) against the two-kernel masked
    dispatch (itself checked against the oracle above): counts and pos equal, and on every row pos names src, expert,
    row_weight, codes and scales equal. The first four tokens route expert 3 nothing, token 0 to expert 1 twice, ids 9
    and -1 nowhere, expert 2 six times past max_m 4 (its count true, pos -1 past the fourth); the rest are random."""
    from kernels.moe.glue import alloc_dispatch, compile_dispatch, run_dispatch
    e, max_m = 8, 4 if t == 4 else 64
    gen = torch.Generator().manual_seed(d + t)
    idx = torch.randint(0, e, (t, 6), generator=gen, dtype=torch.int32)
    idx[:4] = torch.tensor([[1, 1, 0, 2, 4, 5], [0, 2, 9, 4, 5, 6], [7, 6, 5, -1, 2, 0], [2, 2, 1, 2, 1, 0]])
    idx, w = idx.cuda(), torch.rand(t, 6, generator=gen).cuda()
    x = (torch.randn(t, d, generator=gen) * 3).bfloat16().cuda()
    outs = []
    for forms in ({}, {"fused": True}, {"fused": True, "early_x": True}):
        out = alloc_dispatch(t, 6, e, d, max_m, "cuda")
        for v in out.values():
            v.fill_(7) if v.dtype != torch.float32 else v.fill_(float("nan"))
        run_dispatch(compile_dispatch(e, 6, d, "masked", skip_padding=True, pdl=True, **forms), x, idx, w, out,
                     e, max_m)
        outs.append(out)
    two = outs[0]
    rows = two["pos"][two["pos"] >= 0].long()
    if t == 4:
        assert two["counts"][3] == 0 and two["counts"][2] == 6 and (two["pos"] == -1).sum() == 4
    scales = lambda s: s.transpose(1, 2).reshape(e * max_m, -1)  # noqa: E731  [E, D/128, max_m] -> [rows, D/128]
    for one in outs[1:]:
        assert torch.equal(one["counts"], two["counts"]) and torch.equal(one["pos"], two["pos"])
        for name in ("src", "expert", "row_weight", "codes"):
            assert torch.equal(one[name][rows], two[name][rows]), name
        assert torch.equal(scales(one["scales"])[rows], scales(two["scales"])[rows])


@pytest.mark.parametrize("d, t", [(4096, 1), (7168, 8), (512, 300)])
def test_early_combine_matches_the_rules(d, t):
    """v29's combine (pos and the shared output read before griddepcontrol.wait; launched alone, the wait
    returns at once) against the rule's on fresh random rows, dropped entries (pos -1) included: equal bits."""
    from kernels.moe.glue import compile_combine
    gen = torch.Generator().manual_seed(d + t)
    rows = torch.randn(6 * t + 5, d, generator=gen).bfloat16().cuda()
    pos = torch.randperm(6 * t + 5, generator=gen)[:6 * t].view(t, 6).int()
    pos[0, 1] = -1
    pos, shared = pos.cuda(), torch.randn(t, d, generator=gen).bfloat16().cuda()
    ys = []
    for early in (False, True):
        y = torch.full((t, d), float("nan"), dtype=torch.bfloat16, device="cuda")
        compile_combine(d, 6, "sm_90a", pdl=True, early=early)(rows, pos, shared, y)
        ys.append(y)
    assert torch.equal(ys[0], ys[1]) and not ys[1].isnan().any()


def test_masked_dispatch_refuses_counts_past_max_m():
    idx = torch.zeros(20, 6, dtype=torch.int32, device="cuda")
    idx[:, 1:] = torch.arange(1, 6, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="max_m=16 is too small"):
        dispatch(torch.randn(20, 128, device="cuda").bfloat16(), idx, torch.rand(20, 6, device="cuda"), 8, 16)


@pytest.mark.parametrize("t, e, max_m", [(1, 64, None), (300, 16, None), (64, 64, 16), (7, 3, 48)])
def test_dispatch_then_combine_round_trip(t, e, max_m):
    """combine(dequantised dispatch rows) = Σ_k qdq(x)[t] + shared: the two ops agree on the layout."""
    gen = torch.Generator().manual_seed(t)
    x = (torch.randn(t, 512, generator=gen) * 3).bfloat16().cuda()
    idx = torch.stack([torch.randperm(e, generator=gen)[:6] if e >= 6 else torch.randint(0, e, (6,), generator=gen)
                       for _ in range(t)]).int().cuda()
    out = dispatch(x, idx, torch.rand(t, 6, device="cuda"), e, max_m)
    scales = out["scales"] if max_m is None else out["scales"].transpose(1, 2).reshape(-1, 4).t()
    rows = (out["codes"].view(torch.float8_e4m3fn).float().view(-1, 4, 128) * scales.t().unsqueeze(-1)).view(-1, 512)
    shared = torch.randn(t, 512, device="cuda").bfloat16()
    y = combine(rows.bfloat16(), out["pos"], shared)
    want = (6 * fp8_qdq(x, 128) + shared.float()).bfloat16()
    assert (y.float() - want.float()).abs().max() <= 6 * 2.0**-7 * want.float().abs().max()


GEMV_CASES = [c for c in LAYER + [Case("moe", space.case("layer", m, t, load)) for m in space.MODELS
                                  for t, load in ((1, "hot"), (8, "uniform"), (8, "sparse"))]
              if get_impl("moe", "cutedsl:gemv").supports(c, None) is None]


@pytest.mark.parametrize("impl", ["cutedsl:gemv", "cutedsl:gemv-fine"])
@pytest.mark.parametrize("case", GEMV_CASES, ids=[c.id for c in GEMV_CASES])
def test_layer_gemv_passes_the_rule(case, impl, gpu_check):
    """`cutedsl:gemv` (the CUDA-core decode path) and its balanced-unit form on the masked layer cases they
    support (at most 4 tokens an expert; the rest are refused by `supports`)."""
    gpu_check(case, get_impl("moe", impl))


class _GemvOneTokenChunks(MoeGemvFine):
    """gemv-fine compiled to hold one token an expert at a time, run where experts hold several: every
    further token is one more chunk of the unit (the rows read again)."""

    name = "test:gemv-tmax1"

    def compile_key(self, case, arch):
        return (*super().compile_key(case, arch), "tmax 1")

    def compile(self, case, arch):
        return compile_gemv_layer(case["e"], case["k"], case["d"], case["i"], 1, arch, balance=True)


CHUNK_CASES = [Case("moe", space.case("layer", m, 8, "uniform")) for m in space.MODELS]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=[c.id for c in CHUNK_CASES])
def test_gemv_runs_counts_above_tmax_in_chunks(case, gpu_check):
    """Experts holding 2-6 tokens through a tmax-1 compile pass the rule: a count above the compiled tmax
    is run in chunks, never clamped."""
    assert int(counts(case).max()) > 1
    gpu_check(case, _GemvOneTokenChunks())
