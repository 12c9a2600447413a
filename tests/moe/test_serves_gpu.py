"""The model's `moe` op on the moe family's kernels (kernels/moe/serves.py) on the H100, through the
KernelOp the model registers: Flash experts (256 x 4096 -> 2048, top-6) at decode T = 1, 8 (hash:
a token twice on one expert), 64 (hot: every token on expert 0) and 256 (masked), prefill T = 300
and 4096 (contiguous), Pro (384 x 7168 -> 3072) at 8 and 300; fresh random inputs, against the op's
FP32 oracle by the family's layer rule (2x the max error of the low-precision reference moe_lowprec,
relative L2 0.1). The layout the adapter chose and the frame of the weights it handed the GEMMs (v3's
row frame at prefill, v2's block frame at decode), prefill at T = 4096 through the KernelOp's v3 compile
(`-k "contiguous or prefill"`), the weights prepared once (the row frame at the first prefill call), and
the refused path (the tiny model's widths: the oracle runs it, counted). The adapter's mapping on the CPU:
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
    """The params of every routed-layer call (the real kernels run), each with the frame of the weights its
    compiled GEMMs asked for ("frame": v3's row frame at prefill, v2's block frame at decode)."""
    calls = []
    real = serves.routed_layer

    def routed_layer(run, params, *args):
        *rest, prepared = args
        entry = dict(params)
        calls.append(entry)

        def asked(frame):
            entry["frame"] = frame
            return prepared(frame)

        return real(run, params, *rest, asked)

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
    # the tile rule's GEMMs: v3 on the row-frame weights at prefill, v2 on the block frame's at decode
    assert params["frame"] == ("row" if layout == "contiguous" else "block")
    if layout == "masked":
        assert params["max_m"] == serves.masked_rows(args[2], widths["e"])
    torch.cuda.synchronize()


@pytest.mark.parametrize("widths,routing", [(FLASH, "hot"), (FLASH, "hash"), (PRO, "topk")],
                         ids=["flash-hot", "flash-hash", "pro-topk"])
def test_prefill_through_the_adapter_runs_v3_on_row_frame_weights(widths, routing, spy):
    """A prefill call (T = 4096, contiguous) through the model's KernelOp: the compiled GEMMs are v3
    (row_frame), the adapter hands them its row-frame pair (made at this first prefill call, on the block
    pair's codes), and the output passes the family's rule against the op's FP32 oracle."""
    args = moe_args(4096, _seed(), routing=routing, device="cuda", shared_scale=1.0, **widths)
    params = serves.layer_params(4096, 6, widths["e"], widths["d"], widths["i"], args[2])
    assert params["layout"] == "contiguous"
    compiled = _served().runner.compiled(params, {"x": args[0].bfloat16(), "idx": args[2].int(),
                                                  "weights": args[1], "shared": args[0].bfloat16()})
    assert compiled.row_frame and compiled.frame == "row"
    out = _served()(*args)
    m = check(out, args)
    print(m.summary())
    (call,) = spy
    assert call["layout"] == "contiguous" and call["frame"] == "row"
    blocks, rows = serves.layer_weights(args[3], widths["d"]), serves.layer_weights(args[3], widths["d"], "row")
    assert rows[0].frame == rows[1].frame == "row" and rows[0].codes is blocks[0].codes
    torch.cuda.synchronize()


def test_weights_are_prepared_once_and_calls_agree(monkeypatch):
    made = {"block": [], "row": []}
    real, real_row = serves.prepare_experts, serves.prepare_row_frame
    monkeypatch.setattr(serves, "prepare_experts", lambda *a: made["block"].append(len(a[0])) or real(*a))
    monkeypatch.setattr(serves, "prepare_row_frame", lambda *a: made["row"].append(len(a[0])) or real_row(*a))
    args = moe_args(300, _seed(), device="cuda", shared_scale=1.0, **FLASH)
    outs = {}
    for t in (8, 1, 300, 8, 300):  # decode and prefill calls of one layer reuse its prepared weights
        out = _served()(args[0][:t], args[1][:t], args[2][:t], *args[3:])
        if t in outs:
            assert torch.equal(out, outs[t])  # deterministic
        outs[t] = out
        if t == 8 and not made["row"]:
            assert made == {"block": [FLASH["e"]], "row": []}  # decode: no row-frame side data
    assert made == {"block": [FLASH["e"]], "row": [FLASH["e"]]}  # the row frame at the first prefill call


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
