"""The paged decode op on the CPU: DeepGEMM's fused page layout (packing, the two views, a request's
keys through its block table), the per-request oracle against oracles/indexer.py, the low-precision
reference and the torch peer against the oracle (the harness rule; a wrong answer fails), the case
space (production shapes, memory, draws), the pages-per-CTA rule, bad input, and a fresh compile of
the kernel (sm_90a from fake tensors: no local memory, no serialised wgmma)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, get_family
from kernels.indexer.config import choose_parts
from kernels.indexer.decode_glue import (PAGE, cache_views, check_decode, compile_decode, decode_reference,
                                         make_decode_inputs, make_table, pack_pages, request_keys)
from kernels.indexer.decode_sm90 import PAGE_BYTES, DecodeConfig
from oracles.indexer import indexer_scores
from sweeps import indexer as space
from tests.indexer.rule_checks import check_lowprec_torch_and_a_wrong_answer
from tests.wgmma_checks import assert_compiles_clean

FAMILY = get_family("indexer")
DECODE = {"op": ["decode"]}


def test_decode_kernel_compiles_clean():
    assert_compiles_clean(compile_decode, DecodeConfig())


# ---------------- the page layout ----------------

def test_pages_are_deepgemms_fused_layout():
    """Page p = its 64 keys' 128 codes, key-major (8192 B), then their 64 fp32 scales (DeepGEMM's
    kv_cache_cast_to_fp8), and the views read them back."""
    g = torch.Generator().manual_seed(0)
    codes = (torch.randn(3, PAGE, 128, generator=g) * 50).to(torch.float8_e4m3fn)
    scales = torch.rand(3, PAGE, generator=g) + 0.01
    cache = pack_pages(codes, scales)
    assert cache.shape == (3, PAGE, 1, 132) and cache.dtype == torch.uint8 and cache.is_contiguous()
    raw = cache.view(3, PAGE_BYTES)
    assert torch.equal(raw[:, :8192], codes.view(torch.uint8).reshape(3, 8192))
    assert torch.equal(raw[:, 8192:].contiguous().view(torch.float32), scales)
    vc, vs = cache_views(cache)
    assert torch.equal(vc.view(torch.uint8), codes.view(torch.uint8)) and torch.equal(vs, scales)
    assert vc.data_ptr() == cache.data_ptr() and vs.data_ptr() == cache.data_ptr() + 8192


def test_views_of_a_cache_with_padded_pages():
    """A page stride past 8448 bytes (pages inside a larger allocation) is read through the views."""
    x = make_decode_inputs([130], 130, seed=1)
    n = x["kv_cache"].shape[0]
    buf = torch.zeros(n, PAGE_BYTES + 48, dtype=torch.uint8)
    buf[:, :PAGE_BYTES] = x["kv_cache"].view(n, PAGE_BYTES)
    padded = buf.as_strided((n, PAGE, 1, 132), (PAGE_BYTES + 48, 132, 132, 1))
    (pc, ps), (xc, xs) = cache_views(padded), cache_views(x["kv_cache"])
    assert torch.equal(pc.view(torch.uint8), xc.view(torch.uint8)) and torch.equal(ps, xs)
    check_decode(x["q"], padded, x["w"], x["lens"], x["table"], torch.empty(1, 130))


@pytest.mark.parametrize("kind", ["shuffled", "shared"])
def test_request_keys_follow_the_block_table(kind):
    lens = [0, 1, 64, 65, 300]
    x = make_decode_inputs(lens, 300, kind, seed=2, pad_blocks=2)
    codes, scales = cache_views(x["kv_cache"])
    tab = x["table"]
    if kind == "shuffled":  # distinct pages, unused table entries -1
        used = torch.cat([tab[b, :-(-n // PAGE)] for b, n in enumerate(lens)])
        assert used.unique().numel() == used.numel() and (tab[0] == -1).all()
    for b, n in enumerate(lens):
        kv, sc = request_keys(x["kv_cache"], tab, b, n)
        assert kv.shape == (n, 128) and sc.shape == (n,)
        for s in {0, n // 2, n - 1} if n else ():
            page, row = int(tab[b, s // PAGE]), s % PAGE
            assert torch.equal(kv[s].view(torch.uint8), codes[page, row].view(torch.uint8))
            assert sc[s] == scales[page, row]


def test_shared_tables_repeat_pages():
    table, n_pages = make_table([640, 640], 10, "shared", torch.Generator().manual_seed(0))
    assert n_pages == 6 and table.unique().numel() <= 6


# ---------------- the oracle ----------------

def test_reference_is_the_spec_oracle_on_each_requests_dequantised_keys():
    lens = [0, 1, 63, 64, 65, 129]
    x = make_decode_inputs(lens, 140, seed=4)
    ref = decode_reference(**x, width=140)
    for b, n in enumerate(lens):
        assert torch.isneginf(ref[b, n:]).all() and torch.isfinite(ref[b, :n]).all()
        if n:
            kv, sc = request_keys(x["kv_cache"], x["table"], b, n)
            k = kv.float() * sc.unsqueeze(-1)
            want = indexer_scores(x["q"][b:b + 1].float()[None], k[None], x["w"][b:b + 1][None],
                                  torch.full((1,), 4 * n))[0, 0]
            torch.testing.assert_close(ref[b, :n], want, rtol=0, atol=0)


def test_reference_clamps_lengths_as_the_kernel():
    """lens < 0 is 0, lens > W (or past the table) is W: the kernel's clamp, so a contract breach
    is still compared against the same answer."""
    x = make_decode_inputs([10, 10, 10], 64, seed=5)
    x["lens"] = torch.tensor([-3, 64, 1000], dtype=torch.int32)
    ref = decode_reference(**x, width=64)
    assert torch.isneginf(ref[0]).all() and torch.isfinite(ref[1:]).all()


def _cpu_cases():
    cases = FAMILY.cases(SweepOptions(examples=8, seed=3, filters=DECODE))
    small = [c for c in cases if FAMILY.cost(c).bytes <= (8 << 20)]
    extra = [Case("indexer", p) for p in (space.paged_decode(1, 1), space.paged_decode(3, 130, [0, 1, 130]),
                                           space.paged_decode(5, 200, [64, 63, 65, 0, 200], "shared", pad=2),
                                           space.paged_decode(130, 70))]
    return small + extra


CPU_CASES = _cpu_cases()


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.id for c in CPU_CASES])
def test_lowprec_and_torch_pass_the_rule_and_a_wrong_answer_fails(case):
    data, _ = check_lowprec_torch_and_a_wrong_answer(case)
    finite = [int(n) for n in torch.isfinite(data.oracle["logits"]).sum(-1)]
    assert finite == [min(n, case["s_kv"]) for n in space.decode_lens(case.params)]


# ---------------- the case space ----------------

def test_production_decode_shapes_and_their_memory():
    cases = [Case("indexer", p) for p in space.production() if space.is_decode(p)]
    assert sorted({(c["model"], c["t"], c["s_kv"]) for c in cases}) == sorted(
        (m, b, ctx // 4) for m in ("flash", "pro") for b in (1, 32, 128) for ctx in (8192, 65536, 262144, 1048576))
    biggest = max(FAMILY.cost(c).bytes for c in cases)
    assert 4.4e9 < biggest < 8 << 30  # B = 128 at 1M tokens: 4.4 GB of cache, under 8 GiB
    c = Case("indexer", space.paged_decode(128, 262144))
    assert FAMILY.cost(c).flops == 2 * 64 * 128 * 128 * 262144


def test_decode_draws_stay_small_and_hit_the_edges():
    params = [c.params for c in FAMILY.cases(SweepOptions(examples=60, seed=0, grid=False, filters=DECODE))]
    assert params and all(sum(space.decode_lens(p)) <= space.MAX_DRAWN_KEYS for p in params)
    assert all(p["s_kv"] >= max(space.decode_lens(p)) and p["s_kv"] >= 1 for p in params)
    lens = {n for p in params for n in space.decode_lens(p)}
    assert {0, 1, 63, 64, 65} <= lens
    assert {p["table"] for p in params} == {"shuffled", "shared"}
    assert any(p["t"] % 2 and p["t"] > 100 for p in params)


@pytest.mark.parametrize("n_req,pages", [(1, 32), (1, 16384), (32, 1024), (128, 4096), (130, 1), (7, 3)])
def test_parts_cover_the_width_and_fill_the_sms(n_req, pages):
    part = choose_parts(n_req, pages, 132)
    n_parts = -(-pages // part)
    assert 1 <= part <= pages and n_parts * part >= pages and (n_parts - 1) * part < pages
    assert n_req * n_parts >= min(n_req * pages, 264)  # at least one CTA an SM slot when there is work


# ---------------- bad input ----------------

def _ok():
    x = make_decode_inputs([3, 70], 70, seed=6)
    return {**x, "out": torch.empty(2, 70)}


@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.update(q=a["q"].float()), "q must be torch.float8_e4m3fn"),
    (lambda a: a.update(q=a["q"][:1]), "q must be contiguous"),
    (lambda a: a.update(kv_cache=a["kv_cache"].view(-1, 32, 1, 264)[:, :, :, :132]), "kv_cache must be \\[pages, 64"),
    (lambda a: a.update(kv_cache=a["kv_cache"].view(torch.int8)), "kv_cache must be torch.uint8"),
    (lambda a: a.update(kv_cache=a["kv_cache"].view(-1, PAGE, 132)), "kv_cache must be 4-D"),
    (lambda a: a.update(w=a["w"].double()), "w must be torch.float32"),
    (lambda a: a.update(w=torch.empty(2 * 64 + 1)[1:].view(2, 64)), "q and w must be 16-byte aligned"),
    (lambda a: a.update(lens=a["lens"].long()), "lens must be torch.int32"),
    (lambda a: a.update(lens=a["lens"][:1]), "lens must be contiguous \\[2\\]"),
    (lambda a: a.update(table=a["table"].t()), "table must be \\[2, max_blocks\\]"),
    (lambda a: a.update(table=a["table"].long()), "table must be torch.int32"),
    (lambda a: a.update(out=torch.empty(70, 2).t()), "out rows must be contiguous"),
    (lambda a: a.update(out=[1]), "out must be a tensor"),
])
def test_bad_input_is_one_error_naming_the_tensor(mutate, message):
    args = _ok()
    mutate(args)
    with pytest.raises(ValueError, match=f"indexer decode: {message}"):
        check_decode(**args)


def test_good_input_passes_the_checks():
    assert check_decode(**_ok()) == (2, 70)
