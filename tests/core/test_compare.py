"""The docs/benchmarking.md pass rule, on planted errors."""

from __future__ import annotations

import torch

from dsv4bench.core.compare import compare_float, compare_index_sets, compare_outputs, rounding_floor
from dsv4bench.core.registry import Tolerance

TOL = Tolerance()


def make(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    oracle = torch.randn(64, n // 64, generator=g)
    lowprec = oracle.bfloat16().float()
    return oracle, lowprec


def test_correctly_rounded_output_passes():
    oracle, lowprec = make()
    m = compare_float(oracle.bfloat16(), oracle, lowprec, TOL)
    assert m.passed, m.reasons
    assert m.max_abs <= m.bound


def test_one_wrong_element_fails_with_its_coordinates():
    oracle, lowprec = make(seed=1)
    out = oracle.clone().bfloat16()
    out[17, 5] += 0.5
    m = compare_float(out, oracle, lowprec, TOL)
    assert not m.passed
    assert m.worst_index == [17, 5]
    assert abs(m.worst_out - float(out[17, 5])) < 1e-6 and abs(m.worst_oracle - float(oracle[17, 5])) < 1e-6


def test_nan_where_oracle_is_finite_fails():
    oracle, lowprec = make(seed=2)
    out = oracle.bfloat16().clone()
    out[3, 3] = float("nan")
    m = compare_float(out, oracle, lowprec, TOL)
    assert not m.passed and m.mismatches == 1 and "NaN/Inf" in m.reasons[0]


def test_all_zero_output_fails_even_when_values_are_tiny():
    oracle = torch.full((8, 8), 1e-6) * torch.randn(8, 8).sign()
    lowprec = oracle.bfloat16().float()
    m = compare_float(torch.zeros(8, 8), oracle, lowprec, Tolerance(ratio=2.0, rel_l2=10.0))
    assert not m.passed and any("degenerate" in r or "max|err|" in r for r in m.reasons)


def test_relative_l2_bound_catches_diffuse_error():
    oracle, _ = make(seed=3)
    noisy_lowprec = oracle + 0.05 * torch.randn_like(oracle)  # a loose low-precision reference
    out = oracle * 1.03  # every element 3% off: inside the max bound, outside rel L2 1e-2
    m = compare_float(out, oracle, noisy_lowprec, TOL)
    assert not m.passed and any("relative L2" in r for r in m.reasons)


def test_rounding_floor_scales_with_magnitude():
    small, big = torch.full((4,), 0.01), torch.full((4,), 1000.0)
    assert rounding_floor(big, torch.bfloat16) > 100 * rounding_floor(small, torch.bfloat16)


def test_index_sets_compare_order_free():
    ref = torch.tensor([[3, 1, 2], [5, 4, -1]])
    assert compare_index_sets(torch.tensor([[1, 2, 3], [-1, 5, 4]]), ref).passed
    m = compare_index_sets(torch.tensor([[1, 2, 3], [5, 4, 0]]), ref)
    assert not m.passed and m.worst_index == [1]


def test_index_sets_of_empty_rows_compare():
    assert compare_index_sets(torch.empty(3, 0, dtype=torch.int32), torch.empty(3, 0, dtype=torch.int32)).passed
    assert not compare_index_sets(torch.empty(3, 0), torch.empty(2, 0)).passed


def test_missing_output_fails():
    oracle, lowprec = make()
    ok, metrics = compare_outputs({}, {"out": oracle}, {"out": lowprec}, lambda n: TOL)
    assert not ok and "missing" in metrics["out"].reasons[0]


def test_a_value_where_the_oracle_is_masked_fails():
    """-inf in the oracle (a masked logit) must be -inf in the output: a finite value there is wrong."""
    oracle = torch.randn(8, 16)
    oracle[:, 10:] = float("-inf")
    tol = Tolerance(ratio=2.0, rel_l2=1e-2)
    good = oracle + 1e-4 * torch.randn(8, 16)
    low = oracle + 1e-3 * torch.randn(8, 16)  # the low-precision reference's error sets the bound
    assert compare_float(good, oracle, low, tol).passed
    bad = good.clone()
    bad[3, 12] = 0.5
    m = compare_float(bad, oracle, low, tol)
    assert not m.passed and m.mismatches == 1 and "+-inf/NaN differ" in m.reasons[0] and "[3, 12]" in m.reasons[0]
    flipped = good.clone()
    flipped[0, 15] = float("inf")
    assert not compare_float(flipped, oracle, low, tol).passed


def test_an_empty_output_compares_without_error():
    empty = torch.empty(4, 0)
    assert compare_float(empty, empty.clone(), empty.clone(), Tolerance(ratio=2.0, rel_l2=1e-2)).passed


# ---------------- index sets chosen by the kernel's own scores: near-ties ----------------

def _scored_rows(seed=0):
    """Two rows of 1000 scores, the oracle's top 10 of each (sorted), a bf16 reference of the scores."""
    g = torch.Generator().manual_seed(seed)
    sc = torch.randn(2, 1000, generator=g)
    ref = torch.topk(sc, 10, dim=1).indices.sort(dim=1).values.int()
    return sc, ref, sc.bfloat16().float()


def _swap_rank(sc, ref, row, rank):
    """ref with row `row`'s 10th-best index replaced by the index of rank `rank` (0 = best)."""
    out = ref.clone()
    order = sc[row].argsort(descending=True)
    out[row][out[row] == order[9]] = int(order[rank])
    return out


def test_a_swap_at_the_threshold_within_the_reference_error_is_a_near_tie():
    sc, ref, low = _scored_rows()
    sc[0, sc[0].argsort(descending=True)[10]] = sc[0, sc[0].argsort(descending=True)[9]] - 1e-4
    out = _swap_rank(sc, ref, 0, 10)
    m = compare_index_sets(out, ref, sc, low, near=2.0)
    assert m.passed and "near-ties" in m.reasons[0], m.reasons


def test_a_swap_far_below_the_threshold_fails_naming_the_index():
    sc, ref, low = _scored_rows(1)
    out = _swap_rank(sc, ref, 1, 500)
    m = compare_index_sets(out, ref, sc, low, near=2.0)
    assert not m.passed and m.worst_index == [1] and "below the threshold" in m.reasons[-1], m.reasons
    assert not compare_index_sets(out, ref).passed  # without scores: exact sets


def test_scored_sets_still_need_the_same_count_and_distinct_indices():
    sc, ref, low = _scored_rows(2)
    short = ref.clone()
    short[0, 0] = -1
    assert "indices selected" in compare_index_sets(short, ref, sc, low, 2.0).reasons[-1]
    twice = ref.clone()
    twice[0, 1] = twice[0, 0]
    assert "repeated" in compare_index_sets(twice, ref, sc, low, 2.0).reasons[-1]


def test_an_aux_oracle_entry_is_no_output_but_feeds_the_scored_comparison():
    sc, ref, low = _scored_rows(3)
    tol = {"indices": Tolerance(index_set=True, scores="logits", near=2.0), "logits": Tolerance(aux=True)}
    oracle = {"indices": ref, "logits": sc}
    ok, metrics = compare_outputs({"indices": _swap_rank(sc, ref, 0, 700)}, oracle, {"logits": low}, tol.get)
    assert not ok and set(metrics) == {"indices"}
    ok, _ = compare_outputs({"indices": ref.clone()}, oracle, {"logits": low}, tol.get)
    assert ok
