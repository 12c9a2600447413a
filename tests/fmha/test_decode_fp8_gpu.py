"""FP8-cache sparse decode on a GPU: our three launches (v1, kernels/fmha/decode_glue.py) and the fused
kernel (the default `cutedsl`: decode_fused.py, decode_prefetch.py, decode_forms.py, decode_pair.py) and
its knock-outs against the dequantised FP32 oracle by the harness rule (docs/benchmarking.md), on the issue's grid (Flash and
Pro, 1-128 requests; the 128K contexts at 1 and 128 requests) and hypothesis draws (ragged
lengths, -1 indices, fewer valid keys than top-k, duplicates, pages of 61); the split-KV path and
the one-split path (sink in the attention kernel) forced on the same inputs; and against FlashMLA's
`flash_mla_with_kvcache(is_fp8_kvcache=True)` output where it is installed. Skipped without CUDA."""

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import case_generator, poison
from dsv4bench.core.registry import SweepOptions, import_reason
from dsv4bench.core.registry import get_impl
from kernels.fmha.decode_glue import FusedWorkspace, Workspace, fused_slots, plan, run_decode, run_fused
from kernels.fmha.family import FAMILY
from kernels.fmha.glue import FmhaCuteDSL
from kernels.fmha.peers import FlashMLA
from sweeps import fmha as space

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GRID = [Case("fmha", p) for p in space.decode_production() if p["s_kv"] == 8192 or p["b"] in (1, 128)]
DRAWS = [c for c in FAMILY.cases(SweepOptions(examples=48, seed=5, filters=FAMILY.parse_filters({"op": "decode_fp8"})))
         if c.origin == "hypothesis"]
CASES = GRID + DRAWS
IMPL = FmhaCuteDSL()
KNOCK_OUTS = ("cutedsl:decode-no-math", "cutedsl:decode-no-dequant")  # unchecked: they must return
CHECKED = ("cutedsl", "cutedsl:decode-v1", "cutedsl:decode-no-prefetch")  # the default, v1, the default unprefetched
IMPLS = {name: IMPL if name == "cutedsl" else get_impl("fmha", name) for name in (*CHECKED, *KNOCK_OUTS)}
_compiled: dict = {}


def _compiled_for(case, impl="cutedsl"):
    key = (impl, case["h_q"])
    if key not in _compiled:
        _compiled[key] = IMPLS[impl].compile(case, "sm_90a")
    return _compiled[key]


def _inputs(case):
    return FAMILY.make_inputs(case, case_generator(case), "cuda")


def _check(case, x, res, who="cutedsl"):
    ok, metrics = compare_outputs(res, FAMILY.oracle(case, x), FAMILY.lowprec(case, x),
                                  lambda n: FAMILY.tolerance_for(case, n))
    summary = "; ".join(f"{k}: {m.summary()}" for k, m in metrics.items())
    print(who, case, summary)
    assert ok, f"{who} {case}: {summary}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("impl", CHECKED)
def test_decode_matches_dequantised_oracle(case, impl):
    x = _inputs(case)
    out = FAMILY.alloc_outputs(case, "cuda")
    poison(out)
    res = IMPLS[impl].run(case, x, out, _compiled_for(case, impl))
    torch.cuda.synchronize()
    _check(case, x, res, impl)


@pytest.mark.parametrize("case", GRID[:4] + GRID[-4:], ids=[c.id for c in GRID[:4] + GRID[-4:]])
@pytest.mark.parametrize("impl", KNOCK_OUTS)
def test_decode_knock_outs_return(case, impl):
    """The unchecked knock-outs balance their barriers (they return; h_q 64 and 128)."""
    x = _inputs(case)
    out = FAMILY.alloc_outputs(case, "cuda")
    IMPLS[impl].run(case, x, out, _compiled_for(case, impl))
    torch.cuda.synchronize()


@pytest.mark.parametrize("impl", ["cutedsl"])
@pytest.mark.parametrize("split", [(1, None), (2, None), (None, 128)])
@pytest.mark.parametrize("k0", [128, 100])
def test_fused_splits_and_unaligned_window(split, k0, impl):
    """The fused kernel: one split (sink in the kernel), two, one 128-key pair per split; a window list
    that is not a whole number of tiles (cache 0 padded: a tile never mixes the caches)."""
    case = Case("fmha", space._decode(h_q=128, b=3, ctx=4096, k=1024, window=k0, invalid=0.1, ragged=True))
    x = _inputs(case)
    out = FAMILY.alloc_outputs(case, "cuda")
    poison(out)
    n = fused_slots(x["idx0"].shape[1], x["idx1"].shape[1])
    n_split, chunk = split
    if chunk is None:
        chunk = -(-n // n_split // 128) * 128
    n_split = -(-n // chunk)
    run_fused(_compiled_for(case, impl), FusedWorkspace(), x["q"], (x["cache0"], x["cache1"]),
              (x["idx0"], x["idx1"]), (x["len0"], x["len1"]), x["sink"], out["out"], out["lse"], 132,
              split=(n_split, chunk))
    torch.cuda.synchronize()
    _check(case, x, out, f"{impl} split={n_split}x{chunk}")


@pytest.mark.parametrize("sms", [1, 16, 132, 100000])
def test_split_counts_agree(sms):
    """One split (sink in the attention kernel, no combine) up to one 128-key pair per split."""
    case = Case("fmha", space._decode(h_q=128, b=3, ctx=4096, k=1024, invalid=0.1, ragged=True))
    x = _inputs(case)
    out = FAMILY.alloc_outputs(case, "cuda")
    poison(out)
    print("n_split, chunk =", plan(3, 128, case["topk"], sms))
    run_decode(_compiled_for(case, "cutedsl:decode-v1"), Workspace(), x["q"], (x["cache0"], x["cache1"]), (x["idx0"], x["idx1"]),
               (x["len0"], x["len1"]), x["sink"], out["out"], out["lse"], sms)
    torch.cuda.synchronize()
    _check(case, x, out, f"sms={sms}")


def test_poisoned_output_fails_the_rule():
    case = GRID[0]
    x = _inputs(case)
    bad = FAMILY.alloc_outputs(case, "cuda")
    poison(bad)
    ok, _ = compare_outputs(bad, FAMILY.oracle(case, x), FAMILY.lowprec(case, x), lambda n: FAMILY.tolerance)
    assert not ok


PEER_CASES = [c for c in CASES if c["b"] <= 64][:12]


@pytest.mark.skipif(import_reason("flash_mla") is not None, reason="FlashMLA not installed")
@pytest.mark.parametrize("case", PEER_CASES, ids=[c.id for c in PEER_CASES])
def test_flashmla_fp8_decode_agrees(case):
    """FlashMLA passes the same rule on the same caches (our layout and oracle are its), and our output
    is as close to it as either is to the oracle."""
    x = _inputs(case)
    peer = FlashMLA().run(case, x, {}, None)
    torch.cuda.synchronize()
    _check(case, x, peer, "flashmla")
    out = FAMILY.alloc_outputs(case, "cuda")
    ours = IMPL.run(case, x, out, _compiled_for(case))
    torch.cuda.synchronize()
    ref = FAMILY.oracle(case, x)["out"]
    gap = (ours["out"].float() - peer["out"].float()).abs().max()
    worst = max((ours["out"].float() - ref).abs().max(), (peer["out"].float() - ref).abs().max())
    assert gap <= 2 * worst + 1e-3, (float(gap), float(worst))
