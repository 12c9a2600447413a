"""The paged decode kernel against the oracle on the H100: every length edge (0, 1, a page +-1, the
width, past the width or the table: clamped), B from 1 to 130, shuffled and shared (repeated) block
tables, forced pages-per-CTA (part boundaries inside and across pages), padded cache pages, strided
outputs, and family cases (draws and two production shapes) through the harness's evaluation path,
DeepGEMM's fp8_paged_mqa_logits on the same inputs where it imports.

Beyond the harness's float rule every direct check asserts: no NaN (the output is NaN-poisoned: an
unwritten logit shows), -inf exactly at s >= len, and the output's row padding untouched."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import SweepOptions, Tolerance, get_family, get_impl
from kernels.indexer.decode_glue import PAGE, compile_decode, decode_reference, make_decode_inputs, run_decode
from kernels.indexer.decode_sm90 import PAGE_BYTES
from kernels.indexer.family import RELATIVE_MIN_LOGITS
from sweeps import indexer as space

pytestmark = pytest.mark.gpu

FAMILY = get_family("indexer")
_COMPILED: list = []


def _compiled():
    if not _COMPILED:
        _COMPILED.append(compile_decode())
    return _COMPILED[0]


def _run(lens, width, table="shuffled", seed=0, pad_blocks=0, part_pages=None, out_pad=3, page_pad=0, x=None):
    x = x or make_decode_inputs(lens, width, table, seed, "cuda", pad_blocks)
    if page_pad:  # the same pages at a larger stride (pages inside a bigger allocation)
        n = x["kv_cache"].shape[0]
        buf = torch.zeros(n, PAGE_BYTES + page_pad, dtype=torch.uint8, device="cuda")
        buf[:, :PAGE_BYTES] = x["kv_cache"].view(n, PAGE_BYTES)
        x["kv_cache"] = buf.as_strided((n, PAGE, 1, 132), (PAGE_BYTES + page_pad, 132, 132, 1))
    n_req = len(lens)
    full = torch.full((n_req, width + out_pad), float("nan"), device="cuda")
    out = full[:, :width]
    run_decode(_compiled(), **x, out=out, part_pages=part_pages)
    torch.cuda.synchronize()
    what = f"B={n_req} W={width} lens={lens[:8]}{'...' if n_req > 8 else ''} table={table} part={part_pages}"
    _check(out, x, width, what)
    assert torch.isnan(full[:, width:]).all(), f"{what}: a store ran into the row padding"
    return out, x


def _check(out, x, width, what):
    assert not torch.isnan(out).any(), f"{what}: NaN (unwritten?) at {torch.isnan(out).nonzero()[:4].tolist()}"
    n = x["lens"].clamp(0, min(width, PAGE * x["table"].shape[1]))
    valid = torch.arange(width, device=out.device) < n.unsqueeze(-1)
    wrong = torch.isneginf(out) != ~valid
    assert not wrong.any(), f"{what}: -inf mask differs at (request, key) {wrong.nonzero()[:4].tolist()}"
    ref = decode_reference(**x, width=width)
    low = decode_reference(**x, width=width, lowprec=True)
    tol = FAMILY.tolerance if int(valid.sum()) >= RELATIVE_MIN_LOGITS else Tolerance(rel_l2=float("inf"))
    ok, metrics = compare_outputs({"logits": out}, {"logits": ref}, {"logits": low}, lambda name: tol)
    if not ok:
        bad = ((out - ref).abs().nan_to_num(0) > 1e-3 * ref.abs().nan_to_num(0).max()).nonzero()
        raise AssertionError(f"{what}: {metrics['logits'].summary()}; first bad (request, key): {bad[:6].tolist()}")


EDGES = [0, 1, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE - 1, 2 * PAGE, 2 * PAGE + 1, 1000]


@pytest.mark.parametrize("n", EDGES)
def test_one_request_every_length_edge(n):
    _run([n], max(n, 1))


def test_every_edge_in_one_batch_with_a_wider_output():
    _run(EDGES, 1100, pad_blocks=2)


@pytest.mark.parametrize("width", [1, PAGE - 1, PAGE, PAGE + 1, 777])
def test_lengths_equal_to_the_width(width):
    _run([width, width // 2, width], width)


def test_lengths_past_the_width_or_the_table_and_negative_are_clamped():
    x = make_decode_inputs([5, 100, 100, 100], 100, seed=7, device="cuda")
    x["lens"] = torch.tensor([-5, 100, 101, 1 << 30], dtype=torch.int32, device="cuda")
    _run([0] * 4, 100, x=x)


@pytest.mark.parametrize("n_req", [1, 2, 3, 31, 33, 127, 128, 129, 130])
def test_batch_sizes_with_ragged_lengths(n_req):
    g = torch.Generator().manual_seed(n_req)
    lens = torch.randint(0, 3000, (n_req,), generator=g).tolist()
    _run(lens, max(lens) + 5, seed=n_req)


@pytest.mark.parametrize("table", ["shuffled", "shared"])
@pytest.mark.parametrize("part_pages", [1, 2, 3, 7, 1000])
def test_forced_parts_and_tables(table, part_pages):
    _run([0, 1, 64, 65, 640, 700, 1500], 1501, table, seed=part_pages, part_pages=part_pages, pad_blocks=1)


def test_padded_cache_pages():
    _run([1, 130, 700], 700, page_pad=48, seed=3)


def test_production_shapes_b32_at_64k_and_b128_at_8k():
    _run([16384] * 32, 16384, seed=11)
    _run([2048] * 128, 2048, seed=12)


DRAWS = [c for c in FAMILY.cases(SweepOptions(examples=10, seed=5, grid=False, filters={"op": ["decode"]}))]
CASES = DRAWS + [Case("indexer", space.paged_decode(32, 16384, model="flash"))]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_family_cases(case, gpu_check):
    gpu_check(case)


@pytest.mark.parametrize("case", CASES[:4] + CASES[-1:], ids=[c.id for c in CASES[:4] + CASES[-1:]])
def test_deepgemm_peer_on_the_same_cache(case, gpu_check):
    """DeepGEMM's fp8_paged_mqa_logits reads the inputs as ours does: its answer passes the same rule
    (it says the page layout is the one it takes)."""
    peer = get_impl("indexer", "deepgemm")
    if peer.available():
        pytest.skip(peer.available())
    gpu_check(case, peer)
