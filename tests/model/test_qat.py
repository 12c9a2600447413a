"""`--qat on`: the model's FP8 round trips of the window and compressed KV and its FP4 + Hadamard
round trips of the indexer queries and keys are spec §2.3/§2.4 exactly, at rounding boundaries.

A real model run (prefill + decode across CSA block ends) has its three QAT ops' tensor inputs
swapped, call by call, for planted ones whose pre-quantisation values land exactly on e4m3/e2m1
codes, on the midpoints between codes (ties), one ulp either side of them, on the block-scale
boundaries amax = qmax·2^k and its next float, and under the FP8 amax floor; the model keeps its
own positions, RoPE tables, eps and `qat` flag. What the model then caches (window ring,
compressed KV, indexer keys) and feeds the indexer must equal an independent reading of the spec:
grids built from the format definitions, round-to-nearest-even by code parity, the ue8m0 scale
2^ceil(log2(fp32(amax·fp32(1/qmax)))) of [REF-K]'s fast_round_scale."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from dsv4bench.model.config import TINY
from dsv4bench.model.dispatch import OPS, OpTable, register_op
from dsv4bench.model.engine import Engine
from dsv4bench.model.loader import Checkpoint
from dsv4bench.model.synth import write_checkpoint

F32 = np.float32
NOPE = TINY.head_dim - TINY.rope_head_dim  # 448 FP8 dims of a 512 KV row
E4M3 = np.array([m / 8 * 2.0**-6 for m in range(8)] +  # subnormals, then normals; code = index
                [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)][:-1])  # e15 m7 = NaN
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
FP8 = dict(block=64, grid=E4M3, floor=1e-4)
FP4 = dict(block=32, grid=E2M1, floor=6 * 2.0**-126)
COMPRESSOR_OPS = ("compressor_prefill", "compressor_post")  # prefill entries, decode entries
QAT_OPS = ("kv_projection", *COMPRESSOR_OPS, "indexer_queries")


# ---------------------------------------------------------------- the spec, read independently

def spec_scale(amax: float, qmax: float, floor: float) -> float:
    y = float(max(F32(amax), F32(floor)) * F32(1 / qmax))  # fp32 product, correctly rounded
    m, e = math.frexp(y)
    return 2.0 ** (e - 1 if m == 0.5 else e)


def spec_round(mag: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Nearest grid value; a tie goes to the even code."""
    i = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    up = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & (i % 2 == 0))
    return np.where(up, hi, lo)


def spec_qdq(x: torch.Tensor, block: int, grid: np.ndarray, floor: float) -> torch.Tensor:
    v = x.double().numpy().reshape(-1, block)
    out = np.empty_like(v)
    for r, row in enumerate(v):
        s = spec_scale(np.abs(row).max(), grid[-1], floor)
        y = np.clip(row / s, -grid[-1], grid[-1])
        out[r] = np.sign(y) * spec_round(np.abs(y), grid) * s
    return torch.from_numpy(out).float().reshape(x.shape)


# ---------------------------------------------------------------- boundary values

def fp8_targets(rng: np.random.Generator) -> torch.Tensor:
    """448 values, 7 blocks of 64: each a random scale 2^k with its amax exactly 448·2^k, or the
    next float (the scale doubles), or everything under the 1e-4 amax floor; the other values
    exact codes, midpoints (ties) and midpoints ± 1 ulp."""
    blocks = []
    for _ in range(NOPE // 64):
        kind = rng.choice(["at", "above", "floor"])
        s = spec_scale(0.0, 448, 1e-4) if kind == "floor" else 2.0 ** int(rng.integers(-12, 7))
        top = int(np.searchsorted(E4M3, 1e-4 / s)) - 1 if kind == "floor" else len(E4M3) - 1
        i = rng.integers(0, top, 64)
        v = np.where(rng.integers(0, 4, 64) == 0, E4M3[i], (E4M3[i] + E4M3[i + 1]) / 2) * s
        v = v.astype(F32)
        nudge = rng.integers(-1, 2, 64)  # -1, 0, +1 ulp
        v = np.where(nudge < 0, np.nextafter(v, F32(0)), np.where(nudge > 0, np.nextafter(v, F32(np.inf)), v))
        if kind != "floor":
            amax = F32(448 * s)
            v[rng.integers(64)] = amax if kind == "at" else np.nextafter(amax, F32(np.inf))
        blocks.append(np.where(rng.integers(0, 2, 64) == 1, -v, v))
    return torch.from_numpy(np.concatenate(blocks))


def _hits(target: float) -> torch.Tensor:
    """fp32 values T with fl(T · 128^-0.5) == target (the Hadamard's final scaling)."""
    t = torch.tensor(target / 128**-0.5, dtype=torch.float32)
    steps = torch.arange(-8, 9, dtype=torch.float32)
    cand = t + steps * torch.finfo(torch.float32).eps * t.abs()
    cand = torch.unique(torch.cat([cand, torch.nextafter(cand, cand * 2), torch.nextafter(cand, cand * 0)]))
    return cand[(cand * 128**-0.5) == target]


def fp4_pattern(rng: np.random.Generator) -> torch.Tensor | None:
    """A 128-dim pre-Hadamard vector A·e0 + B·e1 whose rotation is (t1, t2) alternating: t1 the
    block amax at 6·2^k (scale 2^k), its next float (the scale doubles), or the ties 5·2^k and
    3.5·2^k; t2 a code, a tie or a tie ± 1 ulp of the same scale. None when no fp32 A, B hit both."""
    s = 2.0 ** int(rng.integers(-10, 8))
    t1 = F32(s * rng.choice([6.0, 5.0, 3.5]))
    if rng.integers(0, 3) == 0:
        t1 = np.nextafter(F32(6 * s), F32(np.inf))
    t2 = F32(s * rng.choice([1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0]))
    if rng.integers(0, 3) == 0:  # one ulp off the code or tie
        t2 = np.nextafter(t2, F32(rng.choice([0, np.inf])))
    t1, t2 = float(t1) * rng.choice([-1, 1]), float(t2) * rng.choice([-1, 1])
    for T1 in _hits(t1):
        for T2 in _hits(t2):
            a0, b0 = (T1 + T2) / 2, (T1 - T2) / 2
            ulp = torch.finfo(torch.float32).eps * max(abs(a0), abs(b0))
            a = a0 + torch.arange(-4, 5) * ulp
            A, B = torch.meshgrid(a, b0 + torch.arange(-4, 5) * ulp, indexing="ij")
            ok = ((A + B) * 128**-0.5 == t1) & ((A - B) * 128**-0.5 == t2)
            if ok.any():
                i, j = torch.nonzero(ok)[0]
                z = torch.zeros(128)
                z[0], z[1] = A[i, j], B[i, j]
                return z
    return None


# ---------------------------------------------------------------- planting the values into a model run

class Planter:
    """Registers backend "test-qat-plant" of the three QAT ops: each call's tensor inputs are
    replaced so that the op's pre-quantisation values are the planted targets; the model's other
    arguments (positions, RoPE table, qat, eps, indexer flag) pass through to the op's oracle."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.calls: list[dict] = []  # scope, op, targets, planted args, output
        for op in QAT_OPS:
            register_op(op, "test-qat-plant", getattr(self, op))
        self.table = OpTable({op: "test-qat-plant" for op in QAT_OPS})

    def _record(self, op, targets, args, kwargs, out, **extra):
        self.calls.append(dict(scope=self.table.scope, op=op, targets=targets, args=args, kwargs=kwargs, out=out,
                               **extra))
        return out

    def kv_projection(self, x, wkv, kv_norm, positions, freqs, eps, qat):
        targets = torch.cat([fp8_targets(self.rng), torch.randn(TINY.rope_head_dim)])
        args = (torch.eye(1, x.shape[-1]).expand(x.shape[0], -1), _column(8.0, TINY.head_dim, x.shape[-1]),
                targets, positions, freqs, eps)
        out = OPS["kv_projection"].oracle(*args, qat=qat)
        return self._record("kv_projection", targets, args, dict(qat=False), out, positions=positions)

    def _entry_targets(self, indexer: bool) -> torch.Tensor:
        return self._fp4() if indexer else torch.cat([fp8_targets(self.rng), torch.randn(TINY.rope_head_dim)])

    def compressor_prefill(self, kv, score, norm_weight, m, freqs, indexer, qat, eps):
        """Equal scores pool the constant 8 exactly (1/4, 1/8 or 1/128 per candidate); its norm is 1."""
        targets = self._entry_targets(indexer)
        args = (torch.full_like(kv, 8.0), torch.zeros_like(score), targets, m, freqs)
        kwargs = dict(indexer=indexer, eps=eps)
        out = OPS["compressor_prefill"].oracle(*args, qat=qat, **kwargs)
        return self._record("compressor_prefill", targets, args, dict(kwargs, qat=False), out, indexer=indexer,
                            rows=out[0])

    def compressor_post(self, c, norm_weight, entry_ids, m, freqs, indexer, qat, eps):
        targets = self._entry_targets(indexer)
        args = (torch.full_like(c, 8.0), targets, entry_ids, m, freqs)
        kwargs = dict(indexer=indexer, eps=eps)
        out = OPS["compressor_post"].oracle(*args, qat=qat, **kwargs)
        return self._record("compressor_post", targets, args, dict(kwargs, qat=False), out, indexer=indexer, rows=out)

    def indexer_queries(self, qr, wq_b, n_heads, positions, freqs, qat):
        targets = torch.cat([self._fp4() for _ in range(n_heads)])
        args = (torch.eye(1, qr.shape[-1]).expand(qr.shape[0], -1), _column(1.0, n_heads * TINY.index_head_dim, qr.shape[-1]) *
                targets[:, None], n_heads, positions, freqs)
        out = OPS["indexer_queries"].oracle(*args, qat=qat)
        return self._record("indexer_queries", targets, args, dict(qat=False), out)

    def _fp4(self) -> torch.Tensor:
        while (z := fp4_pattern(self.rng)) is None:
            pass
        return z


def _column(value: float, rows: int, cols: int) -> torch.Tensor:
    """A weight [rows, cols] that maps the one-hot e0 to `value` in every output."""
    w = torch.zeros(rows, cols)
    w[:, 0] = value
    return w


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    seed = random.randrange(1 << 30)
    print(f"tiny checkpoint seed {seed}")
    return Checkpoint.open(write_checkpoint(TINY, tmp_path_factory.mktemp("tiny"), seed=seed))


def _planted_run(ckpt, qat: bool):
    seed = random.randrange(1 << 30)
    print(f"planting seed {seed}")
    planter = Planter(seed)
    eng = Engine(ckpt, ops=planter.table, qat=qat)
    gen = torch.Generator().manual_seed(seed)
    out = eng.feed(torch.randint(2, TINY.vocab_size, (int(torch.randint(9, 40, (), generator=gen)),), generator=gen))
    for _ in range(9):  # decode across at least two CSA block ends
        out = eng.feed([int(out.logits.argmax())])
    return eng, planter


@pytest.mark.parametrize("qat", [True, False])
def test_the_models_qat_round_trips_are_the_specs_at_rounding_boundaries(ckpt, qat):
    eng, planter = _planted_run(ckpt, qat)
    fp8 = fp4 = 0
    moved = dict.fromkeys(QAT_OPS, 0)
    for c in planter.calls:
        op, out, targets = c["op"], c["out"], c["targets"]
        pre = OPS[op].oracle(*c["args"], **c["kwargs"])  # the same call without the round trip
        if op == "indexer_queries":
            assert torch.equal(pre.flatten(1), hadamard_images(targets).expand_as(pre.flatten(1))), "planting failed"
            want = spec_qdq(pre, **FP4) if qat else pre
            fp4 += pre.numel()
        elif op in COMPRESSOR_OPS and c["indexer"]:
            assert torch.equal(pre, hadamard_images(targets).expand_as(pre)), "planting failed"
            want = spec_qdq(pre, **FP4) if qat else pre
            fp4 += pre.numel()
        else:  # the FP8 round trip of the 448 NoPE dims; the RoPE dims pass through
            assert torch.equal(pre[..., :NOPE], targets[:NOPE].expand_as(pre[..., :NOPE])), "planting failed"
            nope = spec_qdq(pre[..., :NOPE], **FP8) if qat else pre[..., :NOPE]
            want = torch.cat([nope, pre[..., NOPE:]], -1)
            fp8 += pre[..., :NOPE].numel()
        assert torch.equal(out, want), f"{c['scope']} {op}: {(out != want).sum()} values differ from spec"
        moved[op] += not torch.equal(out, pre)
    assert fp8 >= 20 * NOPE and fp4 >= 10 * 128, (fp8, fp4)
    assert all(moved.values()) if qat else not any(moved.values()), moved  # the round trips are real

    # what the model keeps is exactly what the ops returned
    for i, cache in enumerate(eng.caches + [eng.mtp_cache]):
        scope = f"layer {i} attn" if i < TINY.n_layers else "mtp.0 attn"
        mine = [c for c in planter.calls if c["scope"] == scope]
        rows = {}
        for c in (c for c in mine if c["op"] == "kv_projection"):
            rows.update(zip(c["positions"].tolist(), c["out"]))
        assert cache.seen >= 9
        for p in range(max(0, cache.seen - cache.window), cache.seen):
            assert torch.equal(cache.ring[0, p % cache.window], rows[p]), (scope, p)
        main = [c["rows"] for c in mine if c["op"] in COMPRESSOR_OPS and not c["indexer"]]
        index = [c["rows"] for c in mine if c["op"] in COMPRESSOR_OPS and c["indexer"]]
        if main:
            assert torch.equal(cache.comp_kv[0], torch.cat(main)), scope
        if index:
            assert torch.equal(cache.idx_keys[0], torch.cat(index)), scope


def hadamard_images(z: torch.Tensor) -> torch.Tensor:
    """The planted rotations, flat: per 128-dim pattern A·e0 + B·e1, fl((A+B)c), fl((A−B)c) alternating."""
    z = z.reshape(-1, 128)
    pair = torch.stack([(z[:, 0] + z[:, 1]) * 128**-0.5, (z[:, 0] - z[:, 1]) * 128**-0.5], -1)
    return pair.repeat(1, 64).reshape(-1)


def test_spec_reading_on_hand_picked_values():
    """The test's own spec reading, on values whose results are known by hand."""
    x = torch.zeros(64)
    x[:6] = torch.tensor([448.0, 1.0625, 1.1875, 2.0**-10, -3 * 2.0**-10, 0.0])
    assert spec_qdq(x, **FP8)[:6].tolist() == [448.0, 1.0, 1.25, 0.0, -2.0**-8, 0.0]
    x[0] = float(np.nextafter(F32(448), F32(np.inf)))  # the scale doubles: the halves are ties again
    assert spec_qdq(x, **FP8)[:3].tolist() == [448.0, 1.0, 1.25]
    y = torch.tensor([6.0, 5.0, 2.5, 1.75, 0.75, 0.25, -3.5] + [0.0] * 25)
    assert spec_qdq(y, **FP4)[:7].tolist() == [6.0, 4.0, 2.0, 2.0, 1.0, 0.0, -4.0]
    assert spec_qdq(y * 2.0**-140, **FP4)[0].item() == 0.0  # under the FP4 amax floor


def test_qat_off_changes_nothing_but_the_three_round_trips(ckpt):
    """qat=False is the model with each QAT op called with qat=False and nothing else changed:
    bit for bit the same logits as a qat=True model whose three QAT ops ignore the flag."""
    def pinned(op):
        return lambda *a, qat, **k: OPS[op].oracle(*a, qat=False, **k)

    for op in QAT_OPS:
        register_op(op, "test-qat-pinned-off", pinned(op))
    ids = torch.randint(2, TINY.vocab_size, (int(torch.randint(20, 140, ())),)).tolist()
    off = Engine(ckpt, qat=False)
    pinned_on = Engine(ckpt, ops=OpTable({op: "test-qat-pinned-off" for op in QAT_OPS}), qat=True)
    on = Engine(ckpt, qat=True)
    a, b, c = off.feed(ids, all_logits=True), pinned_on.feed(ids, all_logits=True), on.feed(ids, all_logits=True)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.draft_logits, b.draft_logits)
    for tok in (3, 17, 101):
        a, b, c = off.feed([tok]), pinned_on.feed([tok]), on.feed([tok])
        assert torch.equal(a.logits, b.logits) and torch.equal(a.draft_logits, b.draft_logits)
    rel = ((c.logits - a.logits).norm() / a.logits.norm()).item()
    assert rel > 1e-4, rel  # the round trips are real
