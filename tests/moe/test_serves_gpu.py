"""The model's `moe` op on the moe family's kernels (kernels/moe/serves.py) on the H100, through the
KernelOp the model registers: Flash experts (256 x 4096 -> 2048, top-6) at decode T = 1, 8 (hash:
a token twice on one expert), 64 (hot: every token on expert 0) and 256 (masked), prefill T = 300
and 4096 (contiguous), Pro (384 x 7168 -> 3072) at 8 and 300; fresh random inputs, against the op's
FP32 oracle by the family's layer rule (2x the max error of the low-precision reference moe_lowprec,
relative L2 0.1). The layout the adapter chose and the weights it handed the GEMMs (v8: row frame, RS code
tiles, at either layout), prefill at T = 4096 through the KernelOp's compile (`-k "contiguous or prefill"`), the
weights prepared once for decode and prefill, and the refused path (the tiny model's widths: the oracle runs it, counted). The adapter's mapping on the CPU:
test_serves_cpu.py."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from dsv4bench.core.registry import Unsupported
from dsv4bench.model.dispatch import OPS, OpTable, register_kernel_ops
from dsv4bench.model.kernel_ops import served_ops
from kernels.moe import serves
from tests.moe.test_serves_cpu import check, moe_args

pytestmark = pytest.mark.gpu

FLASH = {"e": 256, "d": 4096, "i": 2048}
PRO = {"e": 384, "d": 7168, "i": 3072}


@functools.cache
def _served():
    return served_ops()["moe"]  # the KernelOp the model registers (its compile cache kept across tests)


@pytest.fixture
def spy(monkeypatch):
    """The params of every routed-layer call (the real kernels run), each with the frame and code order of the pair
    the adapter handed its GEMMs."""
    calls = []
    real = serves.routed_layer

    def routed_layer(run, params, *args):
        calls.append({**params, "frame": args[-2].frame, "order": args[-1].order, "run": run})
        return real(run, params, *args)

    monkeypatch.setattr(serves, "routed_layer", routed_layer)
    return calls


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return seed


@pytest.mark.parametrize("widths,tokens,routing,layout", [
    (FLASH, 1, "topk", "masked"), (FLASH, 8, "hash", "masked"), (FLASH, 64, "hot", "masked"),
    (FLASH, 256, "topk", "masked"), (FLASH, 300, "topk", "contiguous"), (FLASH, 4096, "topk", "contiguous"),
    (PRO, 8, "topk", "masked"), (PRO, 300, "hash", "contiguous"),
], ids=lambda v: {4096: "flash", 7168: "pro"}.get(v.get("d")) if isinstance(v, dict) else str(v))
def test_moe_on_the_kernels_passes_the_family_rule(widths, tokens, routing, layout, spy):
    args = moe_args(tokens, _seed(), routing=routing, device="cuda", shared_scale=1.0, **widths)
    out = _served()(*args)
    assert out.dtype == torch.float32 and out.shape == args[0].shape and out.device.type == "cuda"
    m = check(out, args)
    print(m.summary())
    (params,) = spy
    assert params["layout"] == layout and params["t"] == tokens
    # the rule's GEMMs on the one pair: row frame, RS code tiles
    assert (params["frame"], params["order"]) == ("row", "rs")
    if layout == "masked":
        assert params["max_m"] == serves.masked_counts(args[2], widths["e"])[0]
    torch.cuda.synchronize()


@pytest.mark.parametrize("widths,routing", [(FLASH, "hot"), (FLASH, "hash"), (PRO, "topk")],
                         ids=["flash-hot", "flash-hash", "pro-topk"])
def test_prefill_through_the_adapter_runs_v7_on_the_rs_tiles(widths, routing, spy):
    """A prefill call (T = 4096, contiguous) through the model's KernelOp: the compiled GEMMs are v7 on row-frame
    weights and the RS code tiles (v8), the adapter hands them its one pair, and the output passes the family's rule
    against the op's FP32 oracle."""
    args = moe_args(4096, _seed(), routing=routing, device="cuda", shared_scale=1.0, **widths)
    params = serves.layer_params(4096, 6, widths["e"], widths["d"], widths["i"], args[2])
    assert params["layout"] == "contiguous"
    compiled = _served().runner.compiled(params, {"x": args[0].bfloat16(), "idx": args[2].int(),
                                                  "weights": args[1], "shared": args[0].bfloat16()})
    assert compiled.frame == "row" and compiled.codes == "rs"
    out = _served()(*args)
    m = check(out, args)
    print(m.summary())
    (call,) = spy
    assert (call["layout"], call["frame"], call["order"]) == ("contiguous", "row", "rs")
    torch.cuda.synchronize()


def test_weights_are_prepared_once_and_calls_agree(monkeypatch):
    made = []
    real = serves.prepare_experts
    monkeypatch.setattr(serves, "prepare_experts", lambda *a: made.append(len(a[0])) or real(*a))
    args = moe_args(300, _seed(), device="cuda", shared_scale=1.0, **FLASH)
    outs = {}
    for t in (8, 1, 300, 8, 300):  # decode and prefill calls of one layer read its one prepared pair
        out = _served()(args[0][:t], args[1][:t], args[2][:t], *args[3:])
        if t in outs:
            assert torch.equal(out, outs[t])  # deterministic
        outs[t] = out
    assert made == [FLASH["e"]]


def test_the_tiny_widths_are_refused_and_run_on_the_oracle():
    args = moe_args(5, _seed(), e=8, d=64, i=32, k=2, device="cuda")
    with pytest.raises(Unsupported, match="whole 128-blocks"):
        _served()(*args)
    register_kernel_ops()
    ops = OpTable({"moe": "cutedsl"})
    out = ops.moe(*args)
    assert torch.equal(out, OPS["moe"].oracle(*args))
    n, why = ops.refused["moe"]
    assert n == 1 and "D=64, I=32" in why
