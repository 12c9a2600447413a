"""The model's `moe` op adapter (kernels/moe/serves.py) on the CPU: the layout it picks (masked for
decode-size T with max_m from the call's counts, contiguous for prefill), what it refuses, that the
load-time weights are made once per weight set, and the whole adapter against the op's FP32 oracle by
the family's layer rule with only the kernel launches emulated: the routed layer by the torch model
of the grouped GEMM (tests/moe/grouped_model.py) on the adapter's prepared weights, the shared
expert's GEMMs by the gemm family's reference (tests/gemm/test_serves_cpu.py `emulated`). The kernels
themselves: test_serves_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.core.compare import compare_float
from dsv4bench.core.registry import Tolerance, Unsupported, get_family
from dsv4bench.model.dispatch import OPS, ORACLE_ONLY, OpTable, register_kernel_ops
from kernels.gemm import serves as gemm
from kernels.moe import layer, serves
from kernels.moe.family import LAYER_REL_L2
from kernels.moe.glue import layout_size
from kernels.moe.inputs import make_experts
from kernels.moe.layer import CompiledLayer
from oracles.linear import QuantWeight
from oracles.moe import ExpertWeights, combine, dispatch_layout, gather_quant, moe_lowprec
from oracles.quant import quant_fp8_weight
from tests.gemm import served_checks as sc
from tests.gemm.test_serves_cpu import emulated
from tests.moe import grouped_model as model

RULE = Tolerance(ratio=2.0, rel_l2=LAYER_REL_L2)  # the family's layer rule (MoeFamily.tolerance_for)


def emulated_layer(calls: list):
    """serves.routed_layer with the kernels replaced by their torch model, on the adapter's arguments: the
    weights asked for in the frame the runner's impl would compile (layer.weight_frame of its knobs: v4's block frame
    at decode, v7's row frame at prefill); each call's params recorded with that frame."""

    def routed_layer(run, params, x, idx, weights, shared, prepared):
        frame = layer.weight_frame(params["layout"], **run.op.impl.knobs)
        l1, l2 = prepared(frame)
        assert l1.frame == l2.frame == frame
        calls.append({**params, "frame": frame, "run": run})
        assert x.dtype == torch.bfloat16 and idx.dtype == torch.int32 and weights.dtype == torch.float32
        assert shared.dtype == torch.bfloat16 and shared.shape == x.shape
        max_m = params.get("max_m")
        assert (max_m is not None) == (params["layout"] == "masked")
        rows = layout_size(params["t"], params["k"], params["e"], max_m)
        lay = dispatch_layout(idx, weights, params["e"], rows, max_m)
        codes, scales = gather_quant(x, lay["src"], params["e"] if max_m else 1)
        h, hs = model.layer1(lay, codes, scales, l1, max_m)
        y_rows = model.layer2(lay, h, hs, l2)
        assert int((lay["pos"] >= 0).sum()) == idx.numel()  # max_m drops no entry
        return combine(y_rows, lay["pos"], shared).bfloat16()

    return routed_layer


@pytest.fixture
def kernels(monkeypatch):
    """The adapter on CPU tensors, its kernel launches emulated; returns the routed layer's call params."""
    calls: list = []
    monkeypatch.setattr(serves, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(serves, "routed_layer", emulated_layer(calls))
    monkeypatch.setattr(gemm, "kernel_runner", emulated)
    return calls


def moe_args(tokens: int, seed: int, e: int = 8, d: int = 256, i: int = 256, k: int = 6, routing: str = "topk",
             device: str = "cpu", shared_scale: float = 1 / 16):
    """(x fp32 [T, D], weights, idx int64 [T, k], experts (a list, as the model passes), shared, limit).
    shared_scale scales the shared expert's w2 so that the routed part (MXFP4 weights ~2^-8 x e2m1)
    is not drowned by it: at D = I = 256 1/16 makes them comparable (at Flash widths, 1)."""
    gen = torch.Generator().manual_seed(seed)
    stacked = make_experts(e, d, i, torch.Generator(device).manual_seed(seed), device)
    experts = [stacked[j] for j in range(e)]
    x = (torch.randn(tokens, d, generator=gen) * 2).to(device)
    if routing == "hash":  # a token may hit one expert twice (tid2eid rows)
        idx = torch.randint(0, e, (tokens, k), generator=gen)
    elif routing == "hot":  # every token's first choice is expert 0
        rest = [1 + torch.randperm(e - 1, generator=gen)[:k - 1] for _ in range(tokens)]
        idx = torch.cat([torch.zeros(tokens, 1, dtype=torch.long), torch.stack(rest)], 1)
    else:
        idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=gen) + 0.1
    w = w / w.sum(-1, keepdim=True) * 1.5
    codes, scale = quant_fp8_weight(torch.randn(d, i, generator=gen) * i**-0.5 * shared_scale)
    shared = ExpertWeights(sc._weight(i, d, gen, device), QuantWeight(codes.to(device), scale.to(device)),
                           sc._weight(i, d, gen, device))
    return x, w.to(device), idx.to(device), experts, shared, 10.0


def check(out, args):
    oracle = OPS["moe"].oracle(*args)
    x, *rest = args
    low = moe_lowprec(x.bfloat16(), *rest).float()
    m = compare_float(out, oracle, low, RULE)
    assert m.passed, m.summary()
    return m


def test_the_family_serves_moe_and_it_is_off_the_oracle_only_list():
    assert get_family("moe").serves == serves.OPS and "moe" not in ORACLE_ONLY
    assert "moe" in register_kernel_ops()


@pytest.mark.parametrize("tokens,n_experts,layout", [(1, 256, "masked"), (8, 256, "masked"), (64, 384, "masked"),
                                                     (256, 256, "masked"), (257, 256, "contiguous"),
                                                     (300, 8, "contiguous"), (4096, 256, "contiguous"),
                                                     (1, 513, "contiguous")])
def test_layout_choice_is_the_familys_rule(tokens, n_experts, layout):
    assert serves.choose_layout(tokens, n_experts) == layout


def test_masked_rows_are_the_largest_count_rounded_to_16():
    idx = torch.tensor([[0, 1], [0, 2], [0, 0], [3, -1]])
    assert serves.masked_rows(idx, 4) == 16  # expert 0: 4 entries (twice in one token)
    assert serves.masked_rows(torch.zeros(17, 6, dtype=torch.long), 8) == 112  # 102 -> 112
    assert serves.masked_rows(torch.full((3, 2), 9), 4) == 16  # nothing routed: at least one row


def test_decode_at_batch_1_takes_the_smallest_max_m_without_reading_the_counts(monkeypatch):
    monkeypatch.setattr(serves, "masked_rows", lambda idx, e: pytest.fail("read the counts"))
    idx = torch.zeros(2, 6, dtype=torch.long)  # even 12 entries on one expert fit 16 rows
    assert serves.layer_params(2, 6, 256, 4096, 2048, idx) == {"op": "layer", "e": 256, "k": 6, "d": 4096,
                                                             "i": 2048, "t": 2, "layout": "masked", "max_m": 16}
    assert "max_m" not in serves.layer_params(300, 6, 256, 4096, 2048, idx)


@pytest.mark.parametrize("tokens,routing,layout", [(1, "topk", "masked"), (8, "hash", "masked"),
                                                   (64, "hot", "masked"), (300, "topk", "contiguous"),
                                                   (300, "hash", "contiguous")])
def test_adapter_passes_the_family_rule(tokens, routing, layout, kernels):
    args = moe_args(tokens, random.randrange(1 << 30), routing=routing)
    out = serves.moe(None, *args)
    assert out.dtype == torch.float32 and out.shape == args[0].shape
    check(out, args)
    (params,) = kernels
    assert params["layout"] == layout and params["t"] == tokens and (params["e"], params["k"]) == (8, 6)
    assert (params["d"], params["i"]) == (256, 256)
    assert params["frame"] == ("row" if layout == "contiguous" else "block")  # v3 at prefill, v4 at decode
    # decode runs v4's GEMMs, prefill v7's on the plain codes (serves.decode_runner / prefill_runner: the rule's v5
    # and v7 read the RS-ordered tiles, a second copy of the codes)
    assert params["run"] is (serves.decode_runner() if layout == "masked" else serves.prefill_runner())
    assert params["run"].op.impl.name == ("cutedsl:v4" if layout == "masked" else "cutedsl:v7")
    if layout == "masked":
        assert params["max_m"] == serves.masked_rows(args[2], 8)
        if routing == "hot":
            assert params["max_m"] == 64  # all 64 tokens on expert 0


@pytest.mark.parametrize("tokens", [32, 300])  # decode (v2, block frame) and prefill (v3, row frame)
def test_swapped_gate_and_up_fail_the_rule(tokens, kernels, monkeypatch):
    """The check has teeth: w1 and w3 swapped in the prepared L1 weight fail the family's rule."""
    real = serves.prepare_layer
    monkeypatch.setattr(serves, "prepare_layer",
                        lambda w1, s1, w3, s3, w2, s2, **kw: real(w3, s3, w1, s1, w2, s2, **kw))
    args = moe_args(tokens, random.randrange(1 << 30))
    with pytest.raises(AssertionError):
        check(serves.moe(None, *args), args)


def test_the_row_frame_side_data_is_what_the_kernel_needs_on_the_block_pairs_codes():
    """prepare_row_frame: the row-frame side data of expert_weights.prepare(frame="row") (one column scale per
    row), the codes the block pair's own tensors (not a copy); the block pair unchanged."""
    x, w, idx, experts, *_ = moe_args(3, 11)
    blocks = serves.prepare_experts(experts, 256, 256)
    before = [(t.shift.clone(), t.col_scale.clone()) for t in blocks]
    rows = serves.prepare_row_frame(experts, 256, 256, blocks)
    from kernels.moe.expert_weights import prepare_layer
    st = lambda n, a: torch.stack([getattr(getattr(ex, n), a).view(torch.uint8) for ex in experts])  # noqa: E731
    want = prepare_layer(*(st(n, a) for n in ("w1", "w3", "w2") for a in ("weight", "scale")), frame="row")
    for got, ref, blk, (shift, col) in zip(rows, want, blocks, before):
        assert got.frame == "row" and blk.frame == "block"
        assert got.codes is blk.codes and torch.equal(got.codes, ref.codes)
        assert torch.equal(got.shift, ref.shift) and torch.equal(got.col_scale, ref.col_scale)
        assert bool((got.col_scale == got.col_scale[:, :1]).all())  # one column scale per row
        assert torch.equal(blk.shift, shift) and torch.equal(blk.col_scale, col)


def _count_prepares(monkeypatch) -> dict:
    made = {"block": [], "row": []}
    real, real_row = serves.prepare_experts, serves.prepare_row_frame
    monkeypatch.setattr(serves, "prepare_experts", lambda *a: made["block"].append(len(a[0])) or real(*a))
    monkeypatch.setattr(serves, "prepare_row_frame", lambda *a: made["row"].append(len(a[0])) or real_row(*a))
    return made


def test_weights_are_prepared_once_per_weight_set(kernels, monkeypatch):
    """The block frame once per weight set at its first call; the row frame (v3, prefill) once, at its first
    prefill call, never for decode-only calls, on the block pair's codes; both again for a weight written."""
    made = _count_prepares(monkeypatch)
    a = moe_args(300, 1)
    b = moe_args(300, 2)  # a second layer's experts
    decode = lambda args: (args[0][:4], args[1][:4], args[2][:4], *args[3:])  # noqa: E731
    for _ in range(2):
        serves.moe(None, *decode(a))
        serves.moe(None, *decode(b))
    assert made == {"block": [8, 8], "row": []}  # decode only: no row-frame side data
    for _ in range(2):
        serves.moe(None, *a)
        serves.moe(None, *decode(a))
    assert made == {"block": [8, 8], "row": [8]}  # a's first prefill call made it, once
    assert [p["frame"] for p in kernels] == ["block"] * 4 + ["row", "block"] * 2
    blocks = serves.layer_weights(a[3], 256)
    rows = serves.layer_weights(a[3], 256, "row")
    assert made == {"block": [8, 8], "row": [8]} and all(r.codes is bl.codes for r, bl in zip(rows, blocks))
    shared_cat = serves._SHARED.get(serves._sources(a[4].w1) + serves._sources(a[4].w3), lambda: None)
    assert shared_cat is not None and shared_cat.weight.shape == (512, 256)  # w1|w3 made once, kept
    # a weight written in place (a new checkpoint loaded into it) is prepared again, in both frames
    a[3][5].w2.weight.add_(1)
    check(serves.moe(None, *a), a)
    assert made == {"block": [8, 8, 8], "row": [8, 8]}
    new_blocks, new_rows = serves.layer_weights(a[3], 256), serves.layer_weights(a[3], 256, "row")
    assert new_rows[0].codes is new_blocks[0].codes and new_blocks[0].codes is not blocks[0].codes
    with pytest.raises(ValueError, match="frame"):
        serves.layer_weights(a[3], 256, "column")


def test_a_row_frame_pair_follows_a_block_pair_made_again(kernels, monkeypatch):
    """A block pair made again without a write (evicted from its cache) gets a row pair on its own codes."""
    args = moe_args(300, 12)
    rows = serves.layer_weights(args[3], 256, "row")
    monkeypatch.setattr(serves, "_EXPERTS", serves.Prepared(size=128))  # the block pair forgotten
    blocks = serves.layer_weights(args[3], 256)
    again = serves.layer_weights(args[3], 256, "row")
    assert again[0].codes is blocks[0].codes and again[1].codes is blocks[1].codes
    assert rows[0].codes is not blocks[0].codes and torch.equal(again[0].col_scale, rows[0].col_scale)


@pytest.mark.parametrize("tokens,frame", [(2, "block"), (300, "row")])
def test_a_prepared_layer_that_does_not_fit_is_refused(tokens, frame, kernels, monkeypatch):
    """The block pair's bytes at any first call; the row frame's (its side data alone) at a prefill call."""
    args = moe_args(tokens, 3)
    if frame == "row":
        serves.layer_weights(args[3], 256)  # the block pair fits
    monkeypatch.setattr(serves, "_check_memory", lambda device, need: (_ for _ in ()).throw(
        Unsupported(f"moe: needs {need} bytes")))
    with pytest.raises(Unsupported, match=f"needs {serves.prepared_bytes(8, 256, 256, frame)} bytes"):
        serves.moe(None, *args)


def test_the_row_frame_costs_its_side_data_alone():
    """8 bytes per 128 K a weight row (shift words + column scales) beside the block pair's codes: ~12% of
    the experts' checkpoint bytes; Flash 0.375 GiB a layer, Pro 1.48 GiB (serves' docstring)."""
    flash, pro = serves.prepared_bytes(256, 4096, 2048, "row"), serves.prepared_bytes(384, 7168, 3072, "row")
    assert flash == 256 * 3 * 4096 * 2048 // 128 * 8 == 3 << 27  # 0.375 GiB
    assert abs(pro / 2**30 - 1.48) < 0.01
    block = serves.prepared_bytes(256, 4096, 2048)
    checkpoint = 256 * 3 * 4096 * 2048 * 17 // 32  # codes (1/2 byte) + e8m0 scales (1/32) an element
    assert abs(block / checkpoint - 1.06) < 0.01 and abs(flash / checkpoint - 0.118) < 0.001


def _with(experts, j, name, w):
    out = list(experts)
    out[j] = out[j]._replace(**{name: w})
    return out


@pytest.mark.parametrize("case,match", [
    ("tiny", r"whole 128-blocks.*D=64, I=32"),
    ("i_ragged", r"whole 128-blocks.*D=256, I=192"),
    ("nvfp4", "w2 is nvfp4"),
    ("dequantised", "w1 is a plain torch.float32 tensor"),
    ("unequal", "expert 3 w3 is mxfp4"),
    ("nan_scale", "NaN"),
    ("limit", "clamps at 10.0, not 7.0"),
    ("mxfp4_shared", "FP8 GEMM takes FP8 weights"),
])
def test_what_the_kernel_cannot_take_is_refused_with_the_reason(case, match, kernels):
    d, i = {"tiny": (64, 32), "i_ragged": (256, 192)}.get(case, (256, 256))
    x, w, idx, experts, shared, limit = moe_args(3, 4, d=d, i=i)
    if case == "nvfp4":
        e0 = experts[0].w2
        experts = _with(experts, 0, "w2", QuantWeight(e0.weight, e0.scale, torch.tensor(1.0)))
    elif case == "dequantised":
        experts = [ex._replace(w1=torch.randn(i, d)) for ex in experts]
    elif case == "unequal":
        e3 = experts[3].w3
        experts = _with(experts, 3, "w3", QuantWeight(e3.weight[:128], e3.scale[:128]))
    elif case == "nan_scale":
        e5 = experts[5].w1
        scale = e5.scale.clone()
        scale.view(torch.uint8)[7, 2] = 255
        experts = _with(experts, 5, "w1", QuantWeight(e5.weight, scale))
    elif case == "limit":
        limit = 7.0
    elif case == "mxfp4_shared":
        shared = shared._replace(w2=QuantWeight(shared.w2.weight.view(torch.int8), shared.w2.scale))
    with pytest.raises(Unsupported, match=match):
        serves.moe(None, x, w, idx, experts, shared, limit)


def test_cpu_inputs_are_refused_and_the_table_runs_the_oracle():
    """Without the emulation: a CPU model run (--backend cutedsl on the CPU) refuses at the device check,
    and the op table runs the oracle and counts it."""
    register_kernel_ops()
    ops = OpTable({"moe": "cutedsl"})
    args = moe_args(5, 6, d=128, i=128)
    out = ops.moe(*args)
    assert torch.equal(out, OPS["moe"].oracle(*args))
    n, why = ops.refused["moe"]
    assert n == 1 and "CUDA" in why


class _Recorder:
    """Stands in for one compiled kernel: records what each launch is given (metadata, not values)."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __call__(self, *args):
        self.log.append((self.name, [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                                     for a in args]))
        self.ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


class _FakeRun:
    """run.compiled as the adapter's runners answer it (serves.decode_runner / prefill_runner): a CompiledLayer of the
    params' layout whose row_frame is their impl's (v4's block frame at decode, v7's row frame at prefill), its
    launches recorded."""

    def __init__(self, kernels):
        self.kernels, self.asked = kernels, []

    def compiled(self, params, inputs):
        self.asked.append((params, {n: t.dtype for n, t in inputs.items()}))
        impl = serves.decode_runner() if params["layout"] == "masked" else serves.prefill_runner()
        return CompiledLayer(self.kernels, row_frame=layer.weight_frame(params["layout"], **impl.op.impl.knobs) == "row")


@pytest.mark.parametrize("tokens", [5, 300])
def test_routed_layer_launches_what_run_layer_launches(tokens, monkeypatch):
    """The adapter's sequence (serves.routed_layer, with its own prepared weights) gives every kernel the
    same operands as the family's layer.run_layer: shapes, strides and dtypes of each launch; at prefill
    (v3) both hand the GEMMs the row-frame weights (the same tensors), at decode (v2) the block frame's."""
    monkeypatch.setattr(layer, "sm_count", lambda device: 132)
    monkeypatch.setattr(layer, "check_fits", lambda counts, max_m: None)  # the counts are never written
    x, w, idx, experts, *_ = moe_args(tokens, 7)
    blocks = serves.prepare_experts(experts, 256, 256)
    pairs = {"block": blocks, "row": serves.prepare_row_frame(experts, 256, 256, blocks)}
    monkeypatch.setattr(layer, "layer_weights", lambda *a: pairs["block"])
    monkeypatch.setattr(layer, "row_frame_weights", lambda *a: pairs["row"])
    params = serves.layer_params(tokens, 6, 8, 256, 256, idx)
    frame = "row" if tokens > serves.MASKED_MAX_T else "block"
    rows, idx32, shared = x.bfloat16(), idx.int(), torch.randn(tokens, 256).bfloat16()
    logs = [], []
    names = ("dispatch", "l1", "l2", "combine")
    recorders = [{n: _Recorder(n, log) for n in names} for log in logs]
    run = _FakeRun(recorders[0])
    asked = []
    serves.routed_layer(run, params, rows, idx32, w, shared, lambda f: asked.append(f) or pairs[f])
    assert asked == [frame]
    compiled = CompiledLayer(recorders[1], row_frame=frame == "row")
    layer.run_layer(compiled, rows, idx32, w, shared, (None,) * 6, 8, params.get("max_m"))
    assert [n for n, _ in logs[0]] == list(names) and logs[0] == logs[1]
    ((got, dtypes),) = run.asked
    assert got == params and dtypes == {"x": torch.bfloat16, "idx": torch.int32, "weights": torch.float32,
                                        "shared": torch.bfloat16}
    for rec in recorders:  # the GEMMs' weight operands (codes, shift words, col_scale) are the frame's tensors
        for name, wt in zip(("l1", "l2"), pairs[frame]):
            assert rec[name].ptrs[2:5] == [wt.codes.data_ptr(), wt.shift.data_ptr(), wt.col_scale.data_ptr()], name
    if frame == "row":  # and they differ from the block frame's (the codes shared)
        assert pairs["row"][0].col_scale.data_ptr() != pairs["block"][0].col_scale.data_ptr()


@pytest.mark.parametrize("tokens,wrong", [(300, "block"), (5, "row")])
def test_weights_of_the_wrong_frame_are_refused_with_the_reason(tokens, wrong, monkeypatch):
    """A prepared pair whose frame is not the compiled GEMMs' (a block-frame pair in v3 at prefill, a
    row-frame pair in v2 at decode) raises before any launch: it would be mis-scaled silently."""
    monkeypatch.setattr(layer, "sm_count", lambda device: 132)
    x, w, idx, experts, *_ = moe_args(tokens, 8)
    blocks = serves.prepare_experts(experts, 256, 256)
    pairs = {"block": blocks, "row": serves.prepare_row_frame(experts, 256, 256, blocks)}
    log: list = []
    run = _FakeRun({n: _Recorder(n, log) for n in ("dispatch", "l1", "l2", "combine")})
    params = serves.layer_params(tokens, 6, 8, 256, 256, idx)
    with pytest.raises(ValueError, match=f"compiled for {'row' if wrong == 'block' else 'block'}-frame weights, "
                                         f"got {wrong} / {wrong}"):
        serves.routed_layer(run, params, x.bfloat16(), idx.int(), w, torch.zeros(tokens, 256).bfloat16(),
                            lambda f: pairs[wrong])
    assert log == []


def test_the_model_calls_the_adapter_with_its_own_arguments(kernels, monkeypatch):
    """The engine on a random checkpoint whose MoE the kernels take (D = I = 256; 8 experts, top-2, hash
    and biased layers, the MTP block), moe alone on the adapter (launches emulated): no call refused, the
    weights prepared once per MoE layer across prefill and decode, the layout by T, logits as near FP32 as
    with moe on its low-precision reference."""
    from dsv4bench.model.config import TINY
    from dsv4bench.model.engine import Engine
    from dsv4bench.model.lowprec_ops import LOWPREC, register_lowprec_ops
    from dsv4bench.model.synthetic import SyntheticCheckpoint

    made = []
    real = serves.prepare_experts
    monkeypatch.setattr(serves, "prepare_experts", lambda *a: made.append(len(a[0])) or real(*a))
    cfg = TINY.with_(dim=256, moe_inter_dim=256)
    ckpt = SyntheticCheckpoint(cfg, seed=random.randrange(1 << 30))
    register_kernel_ops()
    prompt, then = torch.randint(2, cfg.vocab_size, (20,)).tolist(), torch.randint(2, cfg.vocab_size, (2,))

    def logits(ops):  # teacher-forced: the same two decode tokens for every model
        engine = Engine(ckpt, ops=ops)
        return torch.stack([engine.feed(prompt).logits] + [engine.feed([int(t)]).logits for t in then])

    register_lowprec_ops()
    ops = OpTable({"moe": "cutedsl"})
    got, ref, low = logits(ops), logits(OpTable()), logits(OpTable({"moe": LOWPREC}))
    assert ops.refused == {} and ops.calls["moe"] == 3 * (cfg.n_layers + cfg.n_mtp_layers)
    assert made == [8] * (cfg.n_layers + cfg.n_mtp_layers)
    assert {p["layout"] for p in kernels} == {"masked"} and {p["t"] for p in kernels} == {20, 19, 1}  # MTP: 19
    # a random model amplifies the op's ~5% (the FP8 activations) into its logits: held to the model with moe on
    # its low-precision reference (moe_lowprec), as the GPU engine test holds the whole kernel model
    rel, low_rel = (float((v - ref).norm() / ref.norm()) for v in (got, low))
    print(f"logits vs FP32: moe on the adapter {rel:.3g}, on moe_lowprec {low_rel:.3g}")
    assert rel <= 2 * low_rel + 0.02
