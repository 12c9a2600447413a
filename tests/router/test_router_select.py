"""Router v3 (kernels/router/router.py): the selection algorithm emulated on the CPU (order keys,
per-lane tournament, k rounds of max key → min id, strike) against a sort; on a GPU, the branch-free
sqrt.rn against torch.sqrt bit for bit, the selection score against libdevice's sqrt(softplus),
near-tied and tied 6th/7th experts, and the kernel against a sort of the oracle's fp32 scores (same
ids in the same order) and the oracle. The declared variants' compile checks: test_router_variants.py."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from kernels.router.router import KEY_NONE, WARP

ARCH_CPU = "sm_90a"


# ---------------------------------------------------------------- CPU: the algorithm
def order_key_np(v: np.ndarray) -> np.ndarray:
    b = v.astype(np.float32).view(np.int32)
    return np.where(b < 0, b ^ np.int32(0x7FFFFFFF), b)


def select_np(biased: np.ndarray, k: int) -> list[int]:
    """The kernel's selection, lane by lane: lane l owns ids l, l + 32, ...; 2 redux per round."""
    e = biased.shape[0]
    slots = -(-e // WARP)
    keys = np.full((WARP, slots), KEY_NONE, dtype=np.int64)
    ids = np.array([[lane + WARP * s for s in range(slots)] for lane in range(WARP)])
    mask = ids < e
    keys[mask] = order_key_np(biased)[ids[mask]]
    out = []
    for _ in range(k):
        # tournament per lane: max key, ties → lower slot
        best = keys.max(axis=1)
        best_id = np.array([ids[lane][int(np.argmax(keys[lane] == best[lane]))] for lane in range(WARP)])
        top = best.max()
        win = int(np.where(best == top, best_id, 2**31 - 1).min())
        out.append(win)
        keys[ids == win] = KEY_NONE
    return out


def reference_order(biased: np.ndarray, k: int) -> list[int]:
    """Descending value, equal values → lower id first (NaN above everything)."""
    order = sorted(range(biased.shape[0]), key=lambda i: (not np.isnan(biased[i]), -np.nan_to_num(biased[i], nan=0.0), i))
    return order[:k]


@pytest.mark.parametrize("e,k", [(384, 6), (256, 6), (100, 3), (7, 7), (512, 8), (33, 5)])
def test_selection_algorithm_matches_sort(e, k):
    rng = np.random.default_rng(e * 10 + k)
    for trial in range(200):
        v = (rng.standard_normal(e) * 3).astype(np.float32)
        if trial % 4 == 1:  # coarse values: many exact ties, negative and positive zero-crossings
            v = np.round(v * 2) / 2
        if trial % 4 == 2:  # ties across lanes and inside a lane at the 6th / 7th place
            v[:] = -1.0
            v[rng.choice(e, k - 1, replace=False)] = 5.0
        if trial % 4 == 3:
            v[rng.choice(e, 2, replace=False)] = np.float32(np.inf)
            v[rng.choice(e, 2, replace=False)] = np.float32(-np.inf)
        v = v + np.float32(0.0)  # no -0.0: s + bias never is one (s >= +0, and +0 + -0 = +0)
        assert select_np(v, k) == reference_order(v, k)


def test_order_key_is_monotone():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0.0, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38], dtype=np.float32)])
    v = np.sort(v.astype(np.float32))
    keys = order_key_np(v)
    assert np.all(np.diff(keys.astype(np.int64)) >= 0)
    assert np.all((np.diff(keys.astype(np.int64)) == 0) == (np.diff(v) == 0))
    assert keys.min() > KEY_NONE


def test_tied_ids_in_the_kernels_order_pass_and_a_misplaced_weight_fails():
    """Seed 4646's draw: token 1221's experts 144 and 330 tie bit for bit on s + bias (lessons/harness.md 23). The
    oracle orders them as the kernel does; weights meet it beside their ids, so torch.topk's order passes too; a
    weight moved to another id fails."""
    import torch.nn.functional as F

    from dsv4bench.core.evaluate import case_generator
    from kernels.router.family import RouterFamily

    fam = RouterFamily()
    case = Case("router", {"e": 384, "hashed": False, "k": 4, "scale": 1.5, "t": 2856, "vocab": 1000}, 4646,
                "hypothesis")
    x = fam.make_inputs(case, case_generator(case), "cpu")
    oracle, low = fam.oracle(case, x), fam.lowprec(case, x)
    biased = (F.softplus(x["logits"]).sqrt() + x["bias"]).numpy()
    ids = torch.tensor([reference_order(row, 4) for row in biased])  # the kernel's order: lower id first on ties
    s = F.softplus(x["logits"].double()).sqrt().gather(-1, ids)
    weights = (s / s.sum(-1, keepdim=True) * 1.5).float()
    assert ids[1221].tolist()[1:3] == [144, 330] and torch.equal(oracle["indices"], ids)
    tol = lambda n: fam.tolerance_for(case, n)  # noqa: E731
    for order in ([0, 1, 2, 3], [0, 2, 1, 3]):  # the kernel's (and the oracle's) order, torch.topk's
        row_w, row_i = weights.clone(), ids.clone()
        row_w[1221], row_i[1221] = weights[1221, order], ids[1221, order]
        ok, metrics = compare_outputs({"weights": row_w, "indices": row_i}, oracle, low, tol)
        assert ok, {n: m.summary() for n, m in metrics.items()}
    weights[7, [0, 3]] = weights[7, [3, 0]]
    ok, metrics = compare_outputs({"weights": weights, "indices": ids}, oracle, low, tol)
    assert not ok and not metrics["weights"].passed and metrics["indices"].passed


@pytest.mark.parametrize("e,k", [(256, 6), (384, 6), (33, 5)])
def test_tie_draws_tie_and_the_oracle_breaks_them_as_the_kernel(e, k):
    """A `ties` case (sweeps/router.py) puts equal biased scores among the first k + 1 of many rows, and the
    oracle's ids are the kernel's selection (its lane-by-lane emulation, select_np) in order on every row."""
    import torch.nn.functional as F

    from dsv4bench.core.evaluate import case_generator
    from kernels.router.family import RouterFamily
    from sweeps.router import case as router_case

    fam = RouterFamily()
    case = Case("router", router_case(64, e, 1.5, False, k, vocab=1000, ties=True), 0, "hypothesis")
    x = fam.make_inputs(case, case_generator(case), "cpu")
    biased = (F.softplus(x["logits"]).sqrt() + x["bias"]).numpy()
    top = -np.sort(-biased, axis=1)[:, : k + 1]
    assert (np.diff(top, axis=1) == 0).any(axis=1).mean() > 0.2  # 27% of rows at 33 experts, most at 256+
    ids = fam.oracle(case, x)["indices"]
    assert [select_np(row, k) for row in biased] == ids.tolist()
    hashed = Case("router", router_case(8, e, 1.5, True, k, vocab=1000, ties=True), 0, "hypothesis")
    assert set(fam.make_inputs(hashed, case_generator(hashed), "cpu")) == {"logits", "tid2eid", "input_ids"}


# ---------------------------------------------------------------- GPU
def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a"


def _elementwise(mode: str):
    """A compiled kernel out[i] = f(y[i]), one element per thread: f = sqrt_rn ("rn"), the
    selection score ("score") or sqrt(softplus) with libdevice's sqrt.rn ("score_libsqrt")."""
    from kernels.common import compile_kernel, fake_rowmajor
    from kernels.router.router import sqrt_rn, sqrt_softplus, sqrt_softplus_f32

    f = {"rn": sqrt_rn, "score": sqrt_softplus_f32, "score_libsqrt": sqrt_softplus}[mode]

    @cute.kernel
    def kernel(mY: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 256 + tidx
        if i < mY.shape[0]:
            mO[i] = f(cutlass.Float32(mY[i]))

    @cute.jit
    def launch(mY: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mY, mO).launch(grid=[cute.ceil_div(mY.shape[0], 256), 1, 1], block=[256, 1, 1], stream=stream)

    n = cute.sym_int()
    return compile_kernel(launch, fake_rowmajor("fp32", (n,), 4), fake_rowmajor("fp32", (n,), 4), arch=_arch())


def _apply(fn, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(y)
    fn(y, out)
    torch.cuda.synchronize()
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


@pytest.mark.gpu
def test_branch_free_sqrt_is_sqrt_rn():
    """Every 61st non-negative fp32 bit pattern (35 M values: all binades, denormals, 0, inf, NaN)
    plus negatives: bit-identical to torch.sqrt (sqrt.rn.f32)."""
    bits = torch.arange(0, 0x7F800001, 61, dtype=torch.int64, device="cuda").to(torch.int32)
    extra = torch.tensor([0, 1, 2, 3, 0x7FFFFF, 0x800000, 0x0CFFFFFF, 0x0D000000, 0x0D7FFFFF, 0x0D800000,
                          0x7F7FFFFF, 0x7F800000, 0x7FC00000, -(2**31), -(2**31) + 1, 0xBF800000 - 2**32],
                         dtype=torch.int32, device="cuda")
    y = torch.cat([bits, extra]).view(torch.float32)
    assert _same_bits(_apply(_elementwise("rn"), y), torch.sqrt(y))


@pytest.mark.gpu
def test_selection_score_matches_libdevice_sqrt():
    """The selection score (branch-free sqrt) against libdevice sqrt.rn (a slow-path branch) on the
    same expf / log1pf, bit for bit over logits in [-110, 110], random ones and the edges (softplus underflow, the x > 20 switch)."""
    x = torch.linspace(-110.0, 110.0, 1 << 22, device="cuda")
    x = torch.cat([x, torch.randn(1 << 20, device="cuda") * 4.0,
                   torch.tensor([0.0, -0.0, 20.0, 20.000002, 19.999998, -103.0, -104.0, -200.0, 1e30, float("inf"),
                                 float("-inf"), float("nan")], device="cuda")])
    assert _same_bits(_apply(_elementwise("score"), x), _apply(_elementwise("score_libsqrt"), x))


def _route(e, k, scale, logits, bias):
    from kernels.common import compile_kernel
    from kernels.router.family import _fake
    from kernels.router.router import RouterKernel

    t = cute.sym_int()
    fn = compile_kernel(RouterKernel(e, k, scale, False), _fake(cutlass.Float32, (t, e)), _fake(cutlass.Float32, (e,)),
                        None, None, _fake(cutlass.Float32, (t, k)), _fake(cutlass.Int32, (t, k)), arch=_arch())
    w = torch.empty(logits.shape[0], k, device="cuda")
    i = torch.empty(logits.shape[0], k, dtype=torch.int32, device="cuda")
    fn(logits.cuda(), bias.cuda(), None, None, w, i)
    torch.cuda.synchronize()
    return w.cpu(), i.cpu()


def _sorted_ids(logits: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """Per row the first k ids of the fp32 biased scores computed as the oracle does (CPU
    softplus().sqrt() + bias), descending, equal scores → the lower id first (a stable sort)."""
    s = torch.nn.functional.softplus(logits).sqrt() + bias
    return torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :k].to(torch.int32)


def _near_tied_inputs(e: int, t: int, gap_ulps: int, seed: int):
    """Logits and bias whose row-0 6th and 7th biased scores (CPU fp32, as the oracle computes them)
    are `gap_ulps` apart: 0 equal, 1 the 7th one ulp below, -1 one ulp above. The 7th is an expert
    with a lower id than the 6th where one exists, so an exact tie must go to it."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=gen) * 3.0 - 1.0
    bias = torch.randn(e, generator=gen) * 0.5
    s = torch.nn.functional.softplus(logits[0]).sqrt()
    order = torch.argsort(s + bias, descending=True)
    sixth, rest = int(order[5]), order[6:]
    seventh = int(rest[rest < sixth][0]) if bool((rest < sixth).any()) else int(rest[0])
    target = np.float32((s + bias)[sixth])
    for _ in range(abs(gap_ulps)):
        target = np.nextafter(target, np.float32(-np.inf if gap_ulps > 0 else np.inf))
    sj = np.float32(s[seventh])
    b = np.float32(target - sj)
    for _ in range(64):  # nudge the bias until the fp32 sum is exactly the target
        got = np.float32(sj + b)
        if got == target:
            break
        b = np.nextafter(b, np.float32(np.inf if got < target else -np.inf))
    assert np.float32(sj + b) == target
    bias[seventh] = float(b)
    return logits, bias


@pytest.mark.gpu
@pytest.mark.parametrize("e,scale", [(256, 1.5), (384, 2.5)])
@pytest.mark.parametrize("gap", [0, 1, -1])
@pytest.mark.parametrize("t", [1, 37])
def test_near_tied_sixth_and_seventh(e, scale, gap, t):
    """Row 0's 6th and 7th biased scores equal (the lower id must win) or 1 ulp apart: v3 picks
    exactly the ids of a sort of the oracle's fp32 scores (descending, lower id first) in that order,
    on every row, and the oracle's ids and weights by the harness rule (its ties: lower id first)."""
    from kernels.router.family import RouterFamily
    fam = RouterFamily()
    logits, bias = _near_tied_inputs(e, t, gap, seed=e + 3 * gap + t)
    case = Case("router", {"t": t, "e": e, "k": 6, "scale": scale, "hashed": False, "vocab": 1000}, 0, "tie")
    x = {"logits": logits, "bias": bias}
    s = torch.nn.functional.softplus(logits[0]).sqrt() + bias
    want = sorted(range(e), key=lambda i: (-float(s[i]), i))[:6]
    w3, i3 = _route(e, 6, scale, logits, bias)
    assert i3[0].tolist() == want, (i3[0].tolist(), want)
    assert torch.equal(i3, _sorted_ids(logits, bias, 6))
    ok, metrics = compare_outputs({"weights": w3, "indices": i3}, fam.oracle(case, x), fam.lowprec(case, x),
                                  lambda n: fam.tolerance_for(case, n))
    assert ok, {k: m.summary() for k, m in metrics.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("e,k,scale", [(384, 6, 2.5), (256, 6, 1.5), (100, 3, 1.0), (33, 8, 1.5), (512, 8, 2.5)])
@pytest.mark.parametrize("t", [1, 7, 1001])
def test_v3_matches_a_sort_and_the_oracle(e, k, scale, t):
    """Ids: exactly a sort of the oracle's fp32 biased scores (descending, lower id first), in that
    order; weights and ids: the oracle by the harness rule."""
    from kernels.router.family import RouterFamily

    fam = RouterFamily()
    case = Case("router", {"t": t, "e": e, "k": k, "scale": scale, "hashed": False, "vocab": 1000}, 0, "v3")
    gen = torch.Generator().manual_seed(e * t + k)
    x = {"logits": torch.randn(t, e, generator=gen) * 3.0 - 1.0, "bias": torch.randn(e, generator=gen) * 0.5}
    if t == 7:  # extremes: softplus underflow (s = 0 in fp32), the x > 20 branch, huge logits; each once
        n = min(e, 8)
        x["logits"][0, :n] = torch.tensor([-200.0, -104.0, -90.0, 20.0, 25.0, 88.0, 1e6, 3e38])[:n]
    w3, i3 = _route(e, k, scale, x["logits"], x["bias"])
    assert torch.equal(i3, _sorted_ids(x["logits"], x["bias"], k))
    ok, metrics = compare_outputs({"weights": w3, "indices": i3}, fam.oracle(case, x), fam.lowprec(case, x),
                                  lambda n: fam.tolerance_for(case, n))
    assert ok, {k_: m.summary() for k_, m in metrics.items()}
