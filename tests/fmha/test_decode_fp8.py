"""FP8-cache sparse decode on a CPU: FlashMLA's MODEL1 cache layout and quantisation formula (byte
positions, ue8m0 scales at their boundaries, the round trip), the decode oracle (two caches' union,
lengths, -1, duplicates, the sink once), the split-KV plan and the combine's formula (a torch
emulation of the three launches), the case space and the impls' dispatch, and the sm_90a compile."""

import math

import pytest
import torch

from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import case_generator
from dsv4bench.core.registry import SweepOptions
from kernels.fmha.decode_family import is_decode
from kernels.fmha.decode_glue import PAIR, compile_decode, compile_fused, fused_slots, fused_tokens, plan, run_fused
from kernels.fmha.family import FAMILY
from kernels.fmha.glue import FmhaCuteDSL
from kernels.fmha.peers import FA4, CudnnSDPA, FlashMLA
from kernels.fmha.variants import FmhaNoGather
from oracles.fmha import sparse_attention
from oracles.fmha_cache import (block_bytes, dequant_fp8_kvcache, dequant_rows, gather_decode_keys,
                                quantize_fp8_kvcache, sparse_decode_fp8)
from sweeps import fmha as space


def flashmla_quantise_tile(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA tests/quant.py, one 64-value tile, written out: s = 2^ceil(log2(max(amax/448, 1e-4)))."""
    s = 2.0 ** torch.ceil(torch.log2(torch.clamp_min(x.abs().amax(-1).float() / 448.0, 1e-4)))
    return (x.float() / s[..., None]).to(torch.float8_e4m3fn), s


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 512, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_block_layout_byte_positions():
    bs = 64
    assert block_bytes(bs) == 37440  # 64 * 584 = 37376, padded to a multiple of 576
    k = _rows(2 * bs).view(2, bs, 512)
    cache = quantize_fp8_kvcache(k)
    assert cache.shape == (2, bs, 1, 584) and cache.stride()[:2] == (37440, 584)
    raw = cache.view(2, -1)  # the block's bytes in storage order
    for blk, t in ((0, 0), (1, 37), (1, 63)):
        codes, s = flashmla_quantise_tile(k[blk, t, :448].view(7, 64))
        row = raw[blk, t * 576:(t + 1) * 576]
        assert torch.equal(row[:448], codes.view(torch.uint8).flatten())
        assert torch.equal(row[448:].view(torch.bfloat16), k[blk, t, 448:])
        sc = raw[blk, bs * 576 + 8 * t: bs * 576 + 8 * t + 8]
        assert torch.equal(sc[:7].long(), torch.log2(s).long() + 127) and sc[7] == 0


@pytest.mark.parametrize("amax,exp", [(448.0, 0), (448.0 * 1.01, 1), (448.0 * 2 ** -5, -5),
                                      (448.0 * 2 ** -5 * 1.01, -4), (1e-9, -13), (0.0, -13)])
def test_scale_boundaries(amax, exp):
    """amax/448 a power of two keeps it (the tile's largest code is 448); just above it takes the next;
    tiny or zero tiles take the 1e-4 floor (2^-13)."""
    x = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
    x[0, 0, 64:128] = torch.linspace(-1, 1, 64) * 0.5 * amax
    x[0, 0, 64] = -amax
    amax_bf = float(x[0, 0, 64:128].float().abs().max())
    cache = quantize_fp8_kvcache(x)
    e = int(cache.view(1, -1)[0, 576 + 1]) - 127  # tile 1's exponent of token 0 (a block of one token)
    want = math.ceil(math.log2(max(amax_bf / 448.0, 1e-4)))
    assert e == want and (amax_bf != amax or e == exp)
    deq = dequant_fp8_kvcache(cache).view(512).float()
    code = torch.tensor(-amax_bf / 2.0 ** e).to(torch.float8_e4m3fn).float()  # never saturates: |x / s| <= 448
    assert deq[64] == code * 2.0 ** e and abs(float(code)) <= 448.0


def test_round_trip_error_and_idempotence():
    k = (_rows(3 * 61, 1).float() * torch.logspace(-6, 3, 3 * 61)[:, None]).to(torch.bfloat16).view(3, 61, 512)
    cache = quantize_fp8_kvcache(k)
    deq = dequant_fp8_kvcache(cache).view(3, 61, 512)
    assert torch.equal(deq[..., 448:], k[..., 448:])  # RoPE stays bf16
    tile_amax = k[..., :448].float().abs().view(3, 61, 7, 64).amax(-1, keepdim=True)
    err = (deq[..., :448].float() - k[..., :448].float()).view(3, 61, 7, 64).abs()
    # e4m3: half an ulp is at most |x|/16, and at most 2^-10 of the scale in the subnormal range
    scale = 2.0 ** torch.ceil(torch.log2(torch.clamp_min(tile_amax / 448, 1e-4)))
    bound = k[..., :448].float().abs().view(3, 61, 7, 64) / 16 + scale * 2 ** -10
    assert (err <= bound * 1.0001).all()
    # dequantised values are codes times powers of two: quantising them again loses nothing (the bytes
    # may differ: a tile whose amax rounded down takes a smaller scale)
    assert torch.equal(dequant_fp8_kvcache(quantize_fp8_kvcache(deq)).view(3, 61, 512), deq)


def test_dequant_is_flashmla_bf16_product():
    """FlashMLA dequantises as bf16(code) * bf16(scale): exact, so it equals the fp32 product."""
    k = _rows(64, 2).view(1, 64, 512)
    cache = quantize_fp8_kvcache(k)
    deq = dequant_fp8_kvcache(cache).view(64, 512).float()
    codes, s = flashmla_quantise_tile(k[0, :, :448].view(64, 7, 64))
    assert torch.equal(deq[:, :448], (codes.float() * s[..., None]).view(64, 448))


def _decode_case(**kw) -> tuple:
    case = Case("fmha", space._decode(**kw))
    return case, FAMILY.make_inputs(case, case_generator(case), "cpu")


def test_oracle_is_the_union_of_both_caches_with_the_sink_once():
    case, x = _decode_case(h_q=64, b=3, ctx=700, k=40, block=61, invalid=0.2, ragged=True, dup=True)
    out, lse = sparse_decode_fp8(x["q"], (x["cache0"], x["cache1"]), (x["idx0"], x["idx1"]),
                                 (x["len0"], x["len1"]), x["sink"], 512 ** -0.5)
    for r in range(3):  # by hand: each cache's read slots, dequantised, one softmax with the sink
        keys = []
        for i in (0, 1):
            c, idx, ln = x[f"cache{i}"], x[f"idx{i}"][r], int(x[f"len{i}"][r])
            deq = dequant_fp8_kvcache(c).view(-1, 512)
            keys += [deq[int(v)] for v in idx[:ln] if v >= 0]
        kk = torch.stack(keys).float()
        logits = x["q"][r].float() @ kk.T * 512 ** -0.5
        lse_r = torch.logsumexp(logits, -1)
        den = torch.exp(lse_r) + torch.exp(x["sink"])
        o = torch.exp(logits) @ kk / den[:, None]
        assert torch.allclose(lse[r], lse_r, atol=1e-4) and torch.allclose(out[r], o, atol=1e-4, rtol=1e-4)


def test_no_valid_key_gives_zero_and_minus_inf():
    case, x = _decode_case(h_q=64, b=2, ctx=300, k=8)
    x["len0"][1], x["len1"][1] = 0, 0
    x["idx1"][0] = -1
    out, lse = sparse_decode_fp8(x["q"], (x["cache0"], x["cache1"]), (x["idx0"], x["idx1"]),
                                 (x["len0"], x["len1"]), x["sink"], 512 ** -0.5)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()
    assert torch.isfinite(lse[0]).all()


def test_inputs_mean_what_the_params_say():
    case, x = _decode_case(h_q=128, b=2, ctx=8192, k=1024, dup=True)
    assert x["idx0"].shape == (2, 128) and x["idx1"].shape == (2, 1024)
    assert (x["len0"] == 128).all() and (x["len1"] == 1024).all()
    for r in range(2):  # window slots: distinct tokens; dup: some compressed slots repeat
        assert x["idx0"][r].unique().numel() == 128
        assert x["idx1"][r].unique().numel() < 1024
    _, short = _decode_case(h_q=64, b=1, ctx=100, k=512)  # fewer valid keys than top-k
    assert int(short["len0"][0]) == 100 and int((short["idx1"][0] >= 0).sum()) == 25



def _merge_splits(o_part, l_part, sink):
    """The combine's math: log-sum-exp merge of the splits [B, S, H, ...] with the sink counted once;
    a row with no valid key anywhere is zero (lse -inf)."""
    m = l_part.amax(1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(l_part - m_safe)
    tot = w.sum(1)
    den = tot + torch.exp(sink[None] - m_safe[:, 0])
    out = torch.where(tot[..., None] > 0, (w[..., None] * o_part).sum(1) / den[..., None], torch.zeros(()))
    return out, torch.log(tot) + m_safe[:, 0]

def _emulate(x, sms: int) -> tuple:
    """The three launches in torch: W = the gathered keys (unread slot 0 zero), splits per `plan` as
    the attention kernel's rows without the sink, the combine's formula."""
    keys, ok = gather_decode_keys((x["cache0"], x["cache1"]), (x["idx0"], x["idx1"]), (x["len0"], x["len1"]))
    b, n = ok.shape
    h = x["q"].shape[1]
    n_split, chunk = plan(b, h, n, sms)
    assert chunk % PAIR == 0 and n_split * chunk >= n and (n_split - 1) * chunk < n
    widx = torch.full((b, n_split * chunk), -1)
    widx[:, :n] = torch.where(ok, torch.arange(n), -1)
    o_part = torch.empty(b, n_split, h, 512)
    l_part = torch.empty(b, n_split, h)
    for r in range(b):
        rows = widx[r].view(n_split, chunk)
        o_part[r], l_part[r] = sparse_attention(x["q"][r][None].expand(n_split, h, 512), keys[r], rows, None,
                                                512 ** -0.5)
    return (*_merge_splits(o_part, l_part, x["sink"]), n_split)


@pytest.mark.parametrize("sms", [1, 132, 10000])
def test_split_kv_and_combine_reproduce_the_oracle(sms):
    case, x = _decode_case(h_q=64, b=3, ctx=2049, k=512, invalid=0.1, ragged=True)
    out, lse, n_split = _emulate(x, sms)
    ref, ref_lse = FAMILY.oracle(case, x).values()
    assert (n_split == 1) == (sms == 1)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5)


def test_plan_splits_only_while_it_saves_a_wave():
    """Few requests: split down to one pair a CTA; from 64 Pro / 128 Flash requests the grid already
    fills the SMs once and a split would add a second wave."""
    want = {(1, 64): (5, 128), (1, 128): (9, 128), (32, 64): (3, 256), (32, 128): (2, 640),
            (64, 64): (2, 384), (64, 128): (1, 1152), (128, 64): (1, 640), (128, 128): (1, 1152)}
    for (b, h), got in want.items():
        n = 640 if h == 64 else 1152
        assert plan(b, h, n, 132) == got, (b, h)
    for n in (1, 127, 129, 5000):
        n_split, chunk = plan(3, 64, n, 132)
        assert chunk % PAIR == 0 and n_split * chunk >= n > (n_split - 1) * chunk


def test_space_covers_the_issue_and_impls_dispatch():
    grid = [p for p in space.production() if p.get("op") == "decode_fp8"]
    got = {(p["h_q"], p["topk"], p["b"], p["s_kv"]) for p in grid}
    assert got == {(h, t, b, c) for h, t in ((64, 640), (128, 1152)) for b in (1, 32, 64, 128) for c in (8192, 131072)}
    cases = FAMILY.cases(SweepOptions(examples=40, seed=3, filters=FAMILY.parse_filters({"op": "decode_fp8"})))
    drawn = [c for c in cases if c.origin == "hypothesis"]
    assert drawn and all(is_decode(c) for c in cases)
    assert any(c["ragged"] for c in drawn) and any(c["dup"] for c in drawn) and any(c["invalid"] > 0 for c in drawn)
    assert not any(is_decode(c) for c in FAMILY.cases(SweepOptions(examples=4, seed=3, filters=FAMILY.parse_filters(
        {"op": "attention"}))))
    case = Case("fmha", space._decode(h_q=128, b=64))
    assert FmhaCuteDSL().supports(case) is None and FlashMLA().supports(case) is None
    assert FA4().supports(case) and CudnnSDPA().supports(case) and FmhaNoGather().supports(case)
    assert FmhaCuteDSL().compile_key(case, "sm_90a") != FmhaCuteDSL().compile_key(Case("fmha", space._sparse()), "sm_90a")


@pytest.mark.parametrize("h_q", [64, 128])
def test_decode_compiles_for_sm90a_without_gpu(h_q):
    for compiled in compile_decode(h_q, "sm_90a").kernels.values():
        info = parse_cubin(compiled.__cubin__)
        assert info.cubin_bytes > 0 and not info.local_bytes, info


# ---------------------------------------------------------------- v2: the fused kernel (decode_fused.py)
def _emulate_fused(x, sms: int) -> tuple:
    """The fused launch in torch, slot for slot: the kernel's slot -> token rule (`fused_tokens`, cache 0's
    list padded to whole tiles), its row = split chunks per `plan(fused_slots)`, unread slots zero keys with
    a masked score, then the combine's formula."""
    idx, lens = (x["idx0"], x["idx1"]), (x["len0"], x["len1"])
    caches = (x["cache0"], x["cache1"])
    b, h = x["q"].shape[:2]
    n_slots = fused_slots(idx[0].shape[1], idx[1].shape[1])
    n_split, chunk = plan(b, h, n_slots, sms)
    assert chunk % PAIR == 0 and n_split * chunk >= n_slots
    tok = fused_tokens(idx, lens, tuple(c.shape[0] * c.shape[1] for c in caches), n_split * chunk)
    k0p = -(-idx[0].shape[1] // 64) * 64
    keys = torch.zeros(b, n_split * chunk, 512, dtype=torch.bfloat16)
    for r in range(b):
        for c, sl in ((0, slice(0, k0p)), (1, slice(k0p, None))):
            t = tok[r, sl]
            keys[r, sl] = torch.where((t >= 0)[:, None], dequant_rows(caches[c], t), torch.zeros(()))
    o_part = torch.empty(b, n_split, h, 512)
    l_part = torch.empty(b, n_split, h)
    for r in range(b):
        rows = torch.where(tok[r] >= 0, torch.arange(n_split * chunk), -1).view(n_split, chunk)
        o_part[r], l_part[r] = sparse_attention(x["q"][r][None].expand(n_split, h, 512), keys[r], rows, None,
                                                512 ** -0.5)
    return _merge_splits(o_part, l_part, x["sink"])


@pytest.mark.parametrize("kw", [dict(h_q=64, b=3, ctx=2049, k=512, invalid=0.1, ragged=True),
                                dict(h_q=64, b=2, ctx=700, k=40, block=61, invalid=0.2, ragged=True, dup=True),
                                dict(h_q=128, b=2, ctx=9000, k=1152)])
@pytest.mark.parametrize("sms", [1, 132])
def test_fused_slot_rule_reproduces_the_oracle(kw, sms):
    """The fused kernel's slot -> token rule and split (cache 0 padded to whole tiles, both lists' lengths
    and ranges checked per slot, the slots past both lists unread) read each valid slot exactly once."""
    case, x = _decode_case(**kw)
    out, lse = _emulate_fused(x, sms)
    ref, ref_lse = FAMILY.oracle(case, x).values()
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5)


@pytest.mark.parametrize("h_q", [64, 128])
def test_fused_decode_compiles_for_sm90a_without_gpu(h_q):
    """The default (v6) compiles (setmaxnreg 88 / 208) without local memory; one copy of the producer: 64
    HMUL2 (4 segments x 4 rows x 2 words x 2), its L2 prefetches at two sites (6 lines + the scale line
    each), no L1 prefetch, the slot barrier's id in a register; O by stmatrix + 4 TMA boxes, no scalar
    shared stores; Q by 8 TMA boxes of 64 x 64; PDL: the attention kernel lets the combine launch (one
    PREEXIT), the combine waits (ACQBULK)."""
    from dsv4bench.compile.sass import find_nvdisasm, sass_of

    compiled = compile_fused(h_q, "sm_90a", FmhaCuteDSL().decode_form).kernels
    k = compiled["fused"]
    info = parse_cubin(k.__cubin__)
    print(h_q, info)
    assert info.cubin_bytes > 0 and info.local_bytes == 0, info
    if find_nvdisasm() is not None:
        sass = sass_of(k)
        counts = {op: sass.count(op) for op in ("CCTL.E.PF2", "HMUL2", "CCTL.E.PF1", "UTMASTG", "STS.U16", "UTMALDG",
                                                "BAR.SYNC.DEFER_BLOCKING 0xc, 0x40", "PREEXIT")}
        print(counts)
        assert counts == {"CCTL.E.PF2": 14, "HMUL2": 64, "CCTL.E.PF1": 0, "UTMASTG": 4, "STS.U16": 0, "UTMALDG": 8,
                          "BAR.SYNC.DEFER_BLOCKING 0xc, 0x40": 0, "PREEXIT": 1}, counts
        assert sass_of(compiled["combine"]).count("ACQBULK") == 1


@pytest.mark.parametrize("h_q, most", [(64, 520), (128, 560)])
def test_the_producer_half_unit_stays_lean(h_q, most):
    """v7 (lesson 44): a K half-unit of the producer (from its empty wait to its fence: a batch of 4 rows
    a thread) is 469 / 504 SASS instructions at h_q 64 / 128 (v6: 747 / 816), its 16 local 16-byte
    stores carry immediate offsets from one base, and its 24 row and scale loads are
    ld.global.nc.L2::256B. A change that puts address arithmetic back in the row loop fails here."""
    import re

    from dsv4bench.compile.sass import find_nvdisasm, sass_of

    if find_nvdisasm() is None:
        pytest.skip("no nvdisasm")
    sass = sass_of(compile_fused(h_q, "sm_90a", FmhaCuteDSL().decode_form).kernels["fused"])
    lines = [re.sub(r"/\*[0-9a-f]+\*/", "", ln).strip() for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    first_load = next(i for i, ln in enumerate(lines) if "LTC256B" in ln)
    start = max(i for i in range(first_load) if "SYNCS.PHASECHK" in lines[i])
    end = next(i for i in range(first_load, len(lines)) if "FENCE.VIEW.ASYNC.S" in lines[i])
    body = lines[start:end]
    stores = [ln for ln in body if ln.startswith("STS.128")]
    print(h_q, len(body), len(stores))
    assert len(body) <= most, len(body)
    assert len(stores) == 16 and sum("+0x" in ln for ln in stores) >= 15, stores
    assert sum("LDG.E.LTC256B" in ln for ln in body) == 24


def test_head_pair_shares_the_rows_at_h_q_128_and_is_v4_at_64():
    """The head pair: at h_q 128 each CTA stores its 16-byte chunks into the peer too (4 rows x 4 chunks,
    one copy of the producer: 16 STAS.128 sites), frees the peer's halves by remote arrives at CTA scope and
    meets it at two cluster barriers (one MEMBAR.ALL.GPU: the exit's release); at h_q 64 its SASS is
    v4's (FusedEpiTma) but for the kernel's name."""
    import re

    from dsv4bench.compile.sass import find_nvdisasm, sass_of
    from kernels.fmha.decode_forms import FusedEpiTma
    from kernels.fmha.decode_pair import FusedHeadPair

    if find_nvdisasm() is None:
        pytest.skip("no nvdisasm")

    def body(cls, h_q):
        sass = sass_of(compile_fused(h_q, "sm_90a", cls).kernels["fused"])
        return [re.sub(r"/\*[0-9a-f]+\*/", "", ln).strip() for ln in sass.splitlines() if "kernel_cutlass" not in ln]

    assert body(FusedHeadPair, 64) == body(FusedEpiTma, 64)
    pair = "\n".join(body(FusedHeadPair, 128))
    counts = {op: pair.count(op) for op in ("STAS.128", "SYNCS.ARRIVE.TRANS64.RED", "UCGABAR_ARV", "UCGABAR_WAIT",
                                            "MEMBAR.ALL.GPU")}
    print(counts)
    assert counts["STAS.128"] == 16 and counts["SYNCS.ARRIVE.TRANS64.RED"] >= 5, counts
    assert (counts["UCGABAR_ARV"], counts["UCGABAR_WAIT"], counts["MEMBAR.ALL.GPU"]) == (2, 2, 1), counts


def test_decode_knock_outs_compile_without_their_part():
    """decode-no-dequant loads no rows (no 64-bit code loads, no prmt conversion) and decode-no-math issues
    no wgmma, both unchecked; decode-no-prefetch (checked) issues no L2 prefetch."""
    from dsv4bench.compile.sass import find_nvdisasm, sass_of
    from dsv4bench.core.registry import get_impl

    for name, absent in (("cutedsl:decode-no-dequant", ("LTC256B", "HMUL2")), ("cutedsl:decode-no-math", ("HGMMA",)),
                         ("cutedsl:decode-no-prefetch", ("CCTL.E.PF2",))):
        impl = get_impl("fmha", name)
        assert impl.checked == name.endswith("prefetch")
        k = compile_fused(128, "sm_90a", impl.decode_form).kernels["fused"]
        assert parse_cubin(k.__cubin__).local_bytes == 0
        if find_nvdisasm() is not None:
            sass = sass_of(k)
            assert all(op not in sass for op in absent), [op for op in absent if op in sass]


def test_the_default_decode_is_the_fused_head_pair_and_v1_stays_reachable():
    """The measured-faster form is the default (glue.py decode_form); v1 is `cutedsl:decode-v1`."""
    from dsv4bench.core.registry import get_impl
    from kernels.fmha.decode_pair import FusedQTma

    assert FmhaCuteDSL().decode_form is get_impl("fmha", "cutedsl").decode_form is FusedQTma
    v1 = get_impl("fmha", "cutedsl:decode-v1")
    case = Case("fmha", space._decode(h_q=64, b=1))
    assert v1.decode_form is None and v1.checked and v1.supports(case) is None
    assert v1.compile_key(case, "sm_90a") != FmhaCuteDSL().compile_key(case, "sm_90a")


def test_the_default_decode_refuses_blocks_over_1024_tokens_in_supports():
    """The default (packed) producers hold block << 10 | token: a larger cache block is a reason in
    supports (the sweep and the model see it); run_fused's own check is the test below."""
    from dsv4bench.core.registry import get_impl
    from kernels.fmha.decode_glue import PACKED_MAX_BLOCK

    big = Case("fmha", {**space._decode(h_q=64, b=1), "block": 2 * PACKED_MAX_BLOCK})
    assert "blocks of <= 1024" in FmhaCuteDSL().supports(big, "sm_90a")
    assert get_impl("fmha", "cutedsl:decode-v1").supports(big, "sm_90a") is None


def _prmt_sign_rep(w: torch.Tensor, sel: int) -> torch.Tensor:
    """PTX prmt.b32 d, w, 0, sel (default mode) on int64-held words: nibble i of sel picks byte i of
    d from {w, 0}; its bit 3 replicates the sign bit of the picked byte instead."""
    src = [(w >> (8 * k)) & 0xFF for k in range(4)] + [torch.zeros_like(w)] * 4
    d = torch.zeros_like(w)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = torch.where(byte & 0x80 != 0, 0xFF, 0)
        d |= byte << (8 * i)
    return d


@pytest.mark.parametrize("e", [1, 60, 110, 120, 127, 134])
def test_fast_e4m3_conversion_is_exact(e):
    """decode_ptx.e4m3x2_to_bf16x2's bit recipe, emulated: every finite e4m3 code (subnormals and zero
    included) times 2^(e - 127) exactly, for ue8m0 exponents up to 134."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.int64)
    pairs = codes.view(-1, 2)  # two codes a bf16x2 (bytes 0 and 1 of the word)
    w = pairs[:, 0] | (pairs[:, 1] << 8) | (0xAB << 16) | (0xCD << 24)  # bytes 2-3: the other selector's
    t = ((_prmt_sign_rep(w, 0x9180) << 4) & 0x87F087F0) & 0xFFFFFFFF
    lanes = torch.stack([t & 0xFFFF, t >> 16], 1).reshape(-1).to(torch.int32).to(torch.int16)
    raw = lanes.view(torch.bfloat16).float()
    scale2 = torch.tensor([(e + 120) << 7], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    got = (raw * scale2).to(torch.bfloat16)  # mul.rn.bf16x2: the product rounded to bf16
    want = (codes.to(torch.uint8).view(torch.float8_e4m3fn).float() * 2.0 ** (e - 127)).to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    hi = ((_prmt_sign_rep(w, 0xB3A2) << 4) & 0x87F087F0) & 0xFFFFFFFF  # bytes 2-3 go to the other word
    assert int(hi[0]) == ((0xCD & 0x7F) << 20 | (0xCD >> 7) << 31 | (0xAB & 0x7F) << 4 | (0xAB >> 7) << 15)


def test_packed_slots_are_checked_on_the_host():
    """run_fused refuses caches whose block size or block count does not fit the packed word."""
    from kernels.fmha.decode_prefetch import FusedPackedLoop

    compiled = compile_fused(64, "sm_90a", FusedPackedLoop)
    big = torch.empty(2, 2048, 1, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cache0: the packed-slot decode"):
        run_fused(compiled, None, torch.empty(1, 64, 512), (big, big), (None, None), (None, None), None, None, None,
                  132)


@pytest.mark.parametrize("h_q", [64, 128])
def test_the_default_producer_has_no_warp_sync(h_q):
    """The default (with the head pair's split prefetch at h_q 128) carries no WARPSYNC: the producer's per-slot code
    runs under per-thread conditions (a slot not read), where a warp-synchronous op waits for lanes that never
    come. make_warp_uniform under `v >= 0` compiled to 6 WARPSYNC.ALL (a GPU test stalled; lesson 50)."""
    from dsv4bench.compile.sass import find_nvdisasm, sass_of
    from kernels.fmha.decode_pair import FusedQTma

    if find_nvdisasm() is None:
        pytest.skip("no nvdisasm: SASS not checked")
    assert "WARPSYNC" not in sass_of(compile_fused(h_q, "sm_90a", FusedQTma).kernels["fused"])


def test_the_default_decode_stores_o_a_tile_at_a_time():
    """v9 (FusedQTma) against v8's O store (the same class with one box a warpgroup): the same 4 TMA boxes a
    warpgroup, each behind its own barrier (3 bar.sync more), the wait for the boxes' reads kept; no local memory."""
    from dsv4bench.compile.sass import find_nvdisasm, sass_of
    from kernels.fmha.decode_pair import FusedQTma

    class OneBoxAWarpgroup(FusedQTma):
        o_tile_cols = 0

    kernels = [compile_fused(128, "sm_90a", cls).kernels["fused"] for cls in (OneBoxAWarpgroup, FusedQTma)]
    assert all(parse_cubin(k.__cubin__).local_bytes == 0 for k in kernels)
    if find_nvdisasm() is not None:
        base, mine = (sass_of(k) for k in kernels)
        assert mine.count("UTMASTG") == base.count("UTMASTG") == 4
        assert mine.count("BAR.SYNC") == base.count("BAR.SYNC") + 3
        assert mine.count("DEPBAR.LE SB0") == base.count("DEPBAR.LE SB0") >= 1
