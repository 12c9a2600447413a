"""The indexer family on the CPU: the key ranges and the cost model, the thin FP8-cache oracle against
oracles/indexer.py and the definition, the low-precision reference and the torch peer against the
oracle (the harness rule), bad input, the unit schedule, and a fresh compile of every configuration
the rule picks and every declared variant (sm_90a from fake tensors: no local memory, no serialised
wgmma)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, get_family, impls
from kernels.indexer.config import SHIPPED, choose_config, choose_split
from kernels.indexer.family import case_ranges
from kernels.indexer.glue import causal_ranges, check_operands, make_inputs, oracle_of, range_mask, varlen_ranges
from kernels.indexer.logits_sm90 import SMEM_BYTES, LogitsConfig
from oracles.indexer import causal_entry_mask, indexer_scores
from sweeps import indexer as space
from tests.indexer.rule_checks import check_lowprec_torch_and_a_wrong_answer
from tests.wgmma_checks import assert_compiles_clean

FAMILY = get_family("indexer")


# ---------------- key ranges and cost ----------------

@pytest.mark.parametrize("t,s_kv,p0", [(1, 1, 0), (7, 1, 0), (300, 75, 0), (300, 40, 0), (33, 200, 801), (5, 9, 3)])
def test_causal_ranges_are_the_spec_mask(t, s_kv, p0):
    ks, ke = causal_ranges(t, s_kv, p0)
    pos = torch.arange(p0, p0 + t)
    assert torch.equal(range_mask(ks, ke, s_kv), causal_entry_mask(pos, s_kv))


def test_varlen_ranges_pack_sequences_block_diagonally():
    ks, ke, s_kv = varlen_ranges([9, 3, 12])
    assert s_kv == 2 + 0 + 3
    m = range_mask(ks, ke, s_kv)
    assert torch.equal(m[:9, :2], causal_entry_mask(torch.arange(9), 2)) and not m[:9, 2:].any()
    assert not m[9:12].any()  # 3 tokens: no entry yet
    assert torch.equal(m[12:, 2:], causal_entry_mask(torch.arange(12), 3)) and not m[12:, :2].any()


@pytest.mark.parametrize("params", [
    space.causal(4096, 1024), space.causal(16384, 4096), space.causal(1, 1, 3), space.causal(37, 300, 999),
    space.causal(500, 7), space.causal(10, 50, 2), space.varlen([9, 3, 12]), space.varlen([1, 2]),
    space.causal(5, 9, 3, ties=True), space.varlen([9, 3, 12], ties=True), space.causal(2, 1, 0, ties=True),
])
def test_visible_pairs_and_independent_logits_count_the_mask(params):
    case = Case("indexer", params)
    ks, ke = case_ranges(case.params)
    m = range_mask(ks, ke, params["s_kv"])
    assert space.visible_pairs(params) == int(m.sum())
    rows = int(m.any(-1).sum())
    assert space.independent_logits(params) == (rows if params["ties"] else int(m.sum()))


def test_prefill_flops_are_about_half_of_the_dense_product():
    c = Case("indexer", space.causal(16384, 4096))
    dense = 2 * 16384 * 4096 * 64 * 128
    assert 0.49 < FAMILY.cost(c).flops / dense < 0.51


# ---------------- the oracle ----------------

def _inputs(t, s_kv, p0=0, seed=0, ties=False, lens=None):
    if lens is not None:
        ks, ke, s_kv = varlen_ranges(lens)
    else:
        ks, ke = causal_ranges(t, s_kv, p0)
    return make_inputs(ks.numel(), s_kv, ks, ke, seed, ties=ties)


def test_queries_are_exact_in_e4m3():
    """make_inputs' q are the reference's FP4-simulated values, which e4m3 holds exactly."""
    from oracles.hadamard import hadamard_rotate
    from oracles.quant import fp4_qdq

    g = torch.Generator().manual_seed(3)
    q = fp4_qdq(hadamard_rotate(torch.randn(64, 64, 128, generator=g)), 32)
    assert torch.equal(q.to(torch.float8_e4m3fn).float(), q)


@pytest.mark.parametrize("t,s_kv,p0", [(37, 10, 0), (9, 40, 100), (130, 33, 0)])
def test_fp8_cache_oracle_is_the_reference_oracle_on_dequantised_keys(t, s_kv, p0):
    x = _inputs(t, s_kv, p0)
    k = x["kv"].float() * x["sc"].unsqueeze(-1)
    ref = indexer_scores(x["q"].float()[None], k[None], x["w"][None], torch.arange(p0, p0 + t))[0]
    torch.testing.assert_close(oracle_of(**x), ref, rtol=0, atol=0)


def test_fp8_cache_oracle_is_the_definition_with_ranges():
    """fp64 loops over the definition, with arbitrary (also out-of-range) ks / ke."""
    g = torch.Generator().manual_seed(1)
    t, s_kv = 6, 11
    ks = torch.tensor([0, 3, -2, 5, 11, 7], dtype=torch.int32)
    ke = torch.tensor([4, 3, 20, 9, 11, 8], dtype=torch.int32)
    x = make_inputs(t, s_kv, ks, ke, 5)
    out = oracle_of(**x)
    q, k = x["q"].double(), x["kv"].double() * x["sc"].double().unsqueeze(-1)
    for i in range(t):
        for s in range(s_kv):
            if ks[i] <= s < ke[i]:
                v = sum(float(x["w"][i, h]) * max(float(q[i, h] @ k[s]), 0.0) for h in range(64))
                assert abs(float(out[i, s]) - v) <= 1e-5 * max(1.0, abs(v)), (i, s)
            else:
                assert out[i, s] == float("-inf"), (i, s)


def test_ties_make_every_visible_logit_of_a_row_equal():
    x = _inputs(40, 30, 100, ties=True)
    out = oracle_of(**x)
    for row in out:
        vis = row[torch.isfinite(row)]
        assert vis.numel() and torch.equal(vis, vis[:1].expand_as(vis))


LOGITS = {"op": ["logits"]}  # the logits cases (the top-k ones: tests/indexer/test_topk_family_cpu.py)


def _cpu_cases(examples=6, seed=3, max_bytes=8 << 20):
    cases = FAMILY.cases(SweepOptions(examples=examples, seed=seed, filters=LOGITS))
    return [c for c in cases if FAMILY.cost(c).bytes <= max_bytes]


EXTRA = [Case("indexer", p) for p in (space.causal(1, 1, 3), space.causal(2, 1, 0), space.causal(300, 77, 0),
                                       space.causal(257, 129, 700), space.varlen([37, 3, 64, 9]),
                                       space.causal(64, 40, 200, ties=True), space.causal(5, 1000, 0))]
CPU_CASES = _cpu_cases() + _cpu_cases(examples=6, seed=11) + EXTRA


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.id for c in CPU_CASES])
def test_lowprec_and_torch_pass_the_rule_and_a_wrong_answer_fails(case):
    """What tests/conformance checks for every family, on more cases; and the torch peer passes the
    same rule. The wrong answer is put on a visible logit (a wrong value at a masked one fails as well:
    tests/core/test_compare.py)."""
    data, out = check_lowprec_torch_and_a_wrong_answer(case)
    if not torch.isfinite(data.oracle["logits"]).any():  # every logit masked (T = 2 from position 0)
        assert torch.isneginf(data.lowprec["logits"]).all() and torch.isneginf(out["logits"]).all()


def test_relative_rule_is_off_only_for_a_handful_of_logits():
    assert FAMILY.tolerance_for(Case("indexer", space.causal(1, 1, 3)), "logits").rel_l2 == float("inf")
    assert FAMILY.tolerance_for(Case("indexer", space.causal(2, 1000, 0, ties=True)), "logits").rel_l2 == float("inf")
    assert FAMILY.tolerance_for(Case("indexer", space.causal(300, 77)), "logits").rel_l2 == 1e-2


# ---------------- bad input ----------------

def _ops(t=6, s_kv=10):
    x = _inputs(t, s_kv, 40)
    return x["q"], x["kv"], x["sc"], x["w"], x["ks"], x["ke"]


@pytest.mark.parametrize("mutate, message", [
    (lambda q, kv, sc, w, ks, ke: (q.float(), kv, sc, w, ks, ke), "q must be float8_e4m3fn"),
    (lambda q, kv, sc, w, ks, ke: (q[:, :32].contiguous(), kv, sc, w, ks, ke), "q must be [T, 64, 128]"),
    (lambda q, kv, sc, w, ks, ke: (q.transpose(1, 2).contiguous().transpose(1, 2), kv, sc, w, ks, ke),
     "q must be contiguous"),
    (lambda q, kv, sc, w, ks, ke: (q[0], kv, sc, w, ks, ke), "q must be 3-D"),
    (lambda q, kv, sc, w, ks, ke: (q, kv.bfloat16(), sc, w, ks, ke), "kv must be float8_e4m3fn"),
    (lambda q, kv, sc, w, ks, ke: (q, kv[:, :64], sc, w, ks, ke), "kv must be [S_kv, 128]"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc[:-1], w, ks, ke), "sc must have shape (10,)"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc.double(), w, ks, ke), "sc must be float32"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w.bfloat16(), ks, ke), "w must be float32"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w[:, :32], ks, ke), "w must have shape (6, 64)"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w.t().contiguous().t(), ks, ke), "w must be contiguous"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w, ks.long(), ke), "ks must be int32"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w, ks, ke[:3]), "ke must have shape (6,)"),
    (lambda q, kv, sc, w, ks, ke: (q, kv, sc, w, ks, ke.tolist()), "ke must be a tensor"),
])
def test_bad_input_is_one_error_naming_the_tensor(mutate, message):
    args = mutate(*_ops())
    with pytest.raises(ValueError) as e:
        check_operands(*args)
    assert message in str(e.value) and str(e.value).startswith("indexer: ")


def test_bad_output_and_strided_keys():
    q, kv, sc, w, ks, ke = _ops()
    with pytest.raises(ValueError, match=r"indexer: out must be float32"):
        check_operands(q, kv, sc, w, ks, ke, torch.empty(6, 10, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"indexer: out must have shape \(6, 10\)"):
        check_operands(q, kv, sc, w, ks, ke, torch.empty(10, 6))
    with pytest.raises(ValueError, match=r"indexer: out rows must be contiguous"):
        check_operands(q, kv, sc, w, ks, ke, torch.empty(10, 6).t())
    padded = torch.zeros(10, 144, dtype=torch.float8_e4m3fn)
    padded[:, :128] = kv
    assert check_operands(q, padded[:, :128], sc, w, ks, ke, torch.empty(6, 16)[:, :10]) == (6, 10)
    odd = torch.zeros(10, 136, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="indexer: kv rows must be contiguous, 16-byte aligned"):
        check_operands(q, odd[:, :128], sc, w, ks, ke)


# ---------------- the unit schedule (a Python mirror of the kernel's arithmetic) ----------------

def _written(t, s_kv, ks, ke, cfg: LogitsConfig, n_split):
    """How many times each logit is stored, and the key tiles each unit's consumers compute, mirroring
    IndexerLogitsSm90._unit / the fill warps / the epilogue."""
    bq, bk = cfg.bq, cfg.bk
    count = torch.zeros(t, s_kv, dtype=torch.int32)
    q_blocks = -(-t // bq)
    for u in range(q_blocks * n_split):
        blk, part = divmod(u, n_split)
        qb = q_blocks - 1 - blk
        lo, hi = s_kv, 0
        for j in range(bq):
            tt = min(qb * bq + j, t - 1)
            lo, hi = min(lo, max(int(ks[tt]), 0)), max(hi, min(int(ke[tt]), s_kv))
        tile_lo = lo // bk
        n_t = -(-hi // bk) - tile_lo if hi > lo else 0
        t0, t1 = tile_lo + part * n_t // n_split, tile_lo + (part + 1) * n_t // n_split
        rows = [r for r in range(qb * bq, qb * bq + bq) if r < t]
        for kt in range(t0, t1):  # consumers: every (row, key) of the tile inside the output
            for r in rows:
                count[r, kt * bk:min((kt + 1) * bk, s_kv)] += 1
        if part == 0:  # fill warps
            a, b = min(tile_lo * bk, s_kv), min((tile_lo + n_t) * bk, s_kv)
            if n_t == 0:
                a = b = s_kv
            for r in rows:
                count[r, :a] += 1
                count[r, b:] += 1
    return count


@pytest.mark.parametrize("cfg", [SHIPPED, LogitsConfig(), LogitsConfig(bq=1), LogitsConfig(bq=4, n_wg=1),
                                 LogitsConfig(pingpong=True), LogitsConfig(n_wg=3), LogitsConfig(n_wg=4),
                                 LogitsConfig(n_wg=4, tile_wgs=2)], ids=str)
@pytest.mark.parametrize("n_split", [1, 2, 5])
@pytest.mark.parametrize("params", [space.causal(37, 300, 999), space.causal(300, 75), space.causal(1, 1, 0),
                                    space.varlen([9, 3, 200, 1]), space.causal(9, 130, 0)])
def test_every_logit_is_written_exactly_once(cfg, n_split, params):
    ks, ke = case_ranges(params)
    count = _written(params["t"], params["s_kv"], ks, ke, cfg, n_split)
    assert bool((count == 1).all()), torch.nonzero(count != 1)[:5].tolist()


def _group_tiles(g_kv, t0, t1, groups, gi):
    """Mirror of _consume: group gi takes kt = first, first + G, ... (G = groups)."""
    first = t0 + (gi + groups - g_kv % groups) % groups
    return list(range(first, t1, groups))


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("g_kv", [0, 1, 6, 7])
@pytest.mark.parametrize("t0,t1", [(0, 1), (3, 4), (2, 9), (5, 5), (0, 16)])
def test_groups_take_each_tile_once_by_the_ctas_tile_ordinal(groups, g_kv, t0, t1):
    """The CTA's g-th tile (g = g_kv + kt - t0) goes to group g % groups (ping-pong: groups = 2, its
    turn order); every tile of the unit to exactly one group."""
    mine = {gi: _group_tiles(g_kv, t0, t1, groups, gi) for gi in range(groups)}
    assert sorted(sum(mine.values(), [])) == list(range(t0, t1))
    for gi in range(groups):
        assert all((g_kv + kt - t0) % groups == gi for kt in mine[gi])


def _overlapped(first, t1, groups, chain):
    """Mirror of _tiles_overlapped: the tiles in the order finished, (tile, register set, issued before
    the previous tile's finish) per tile."""
    n_mine = -(-(t1 - first) // groups) if first < t1 else 0
    n_chains = n_mine // chain
    done = []
    for ch in range(n_chains):
        base = first + ch * chain * groups
        for i in range(chain):
            done.append((base + i * groups, i % 2, i > 0))
    done += [(kt, 0, False) for kt in range(first + n_chains * chain * groups, t1, groups)]
    return done


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("chain", [2, 3, 4])
@pytest.mark.parametrize("first,t1", [(0, 1), (0, 2), (3, 12), (5, 5), (1, 17), (0, 32)])
def test_overlapped_chains_finish_the_groups_tiles_in_order_alternating_registers(groups, chain, first, t1):
    done = _overlapped(first, t1, groups, chain)
    assert [kt for kt, _, _ in done] == list(range(first, t1, groups))
    # within a chain consecutive tiles alternate accumulators, so the one in flight is never the one read
    for (_, a, _), (_, b, issued_early) in zip(done, done[1:]):
        assert not issued_early or a != b
    whole = (len(range(first, t1, groups)) // chain) * chain
    assert sum(e for _, _, e in done) == whole - whole // chain  # all but each chain's first overlap


def test_out_of_range_ks_ke_are_clamped_by_the_schedule():
    ks = torch.tensor([-5, 3, 90, 0], dtype=torch.int32)
    ke = torch.tensor([400, 2, 100, 0], dtype=torch.int32)
    assert bool((_written(4, 77, ks, ke, LogitsConfig(), 3) == 1).all())


def test_split_fills_the_sms_only_when_blocks_do_not():
    cfg = LogitsConfig()
    assert choose_split(4096, 1024, cfg) == 1
    assert choose_split(1, 262144, cfg) >= 100  # one query over a long cache: spread over the SMs
    assert choose_split(1, 100, cfg) == 1  # too few tiles to split
    assert choose_split(8, 4096, cfg) * 4 <= 2 * 132


# ---------------- compiles ----------------

def test_config_rejects_impossible_tiles():
    with pytest.raises(ValueError, match="bq must be"):
        LogitsConfig(bq=3)
    with pytest.raises(ValueError, match="n_wg must be"):
        LogitsConfig(n_wg=5)
    with pytest.raises(ValueError, match="must divide"):
        LogitsConfig(n_wg=3, tile_wgs=2)
    with pytest.raises(ValueError, match="pingpong takes"):
        LogitsConfig(n_wg=4, pingpong=True)
    with pytest.raises(ValueError, match="overlap chains"):
        LogitsConfig(n_wg=4, overlap=2)
    with pytest.raises(ValueError, match="overlap chains"):
        LogitsConfig(overlap=1)
    with pytest.raises(ValueError, match="holds 192 registers a thread, more than 136"):
        LogitsConfig(n_wg=3, bq=4)  # ptxas: "Insufficient registers (128)"
    with pytest.raises(ValueError, match="with overlap holds 320"):
        LogitsConfig(bq=4, overlap=2)
    with pytest.raises(ValueError, match="3 KV stage.s., fewer than 4"):
        LogitsConfig(n_wg=4, tile_wgs=1, stages=3)
    with pytest.raises(ValueError, match="do not fit"):
        LogitsConfig(stages=20)


def test_register_split_fits_the_launch():
    """setmaxnreg must hand out no more registers than the launch gives the CTA (64K, 8 a step)."""
    for n_wg in (1, 2, 3, 4):
        cfg = LogitsConfig(n_wg=n_wg)
        producer, consumer = cfg.reg_split
        assert producer % 8 == 0 and consumer % 8 == 0 and consumer >= 112
        assert 128 * producer + 128 * n_wg * consumer <= 65536
    assert LogitsConfig(n_wg=4).reg_split == (32, 112)  # DeepGEMM's split for its four warpgroups


def _compile_configs():
    cases = FAMILY.cases(SweepOptions(examples=20, seed=0, filters=LOGITS))
    cfgs = {}
    for impl in impls("indexer", variants=True):
        if impl.compiles:
            for c in cases:
                cfgs.setdefault(impl.config(c), impl.name)
    return sorted(cfgs.items(), key=lambda kv: str(kv[0]))


@pytest.mark.parametrize("cfg,impl", _compile_configs(), ids=lambda v: str(v))
def test_every_config_compiles_without_spills_or_serialised_wgmma(cfg, impl):
    from kernels.indexer.glue import compile_logits

    assert cfg.kv_stage_bytes * cfg.n_stages + cfg.fixed_bytes <= SMEM_BYTES and cfg.n_stages >= 2
    assert_compiles_clean(compile_logits, cfg)


def test_the_rule_picks_one_configuration_for_every_case():
    cases = FAMILY.cases(SweepOptions(examples=20, filters=LOGITS))
    assert {choose_config(c["t"], c["s_kv"]) for c in cases} == {SHIPPED}


def test_the_compile_refuses_a_configuration_whose_shared_memory_does_not_fit():
    from kernels.indexer.glue import compile_logits

    cfg = LogitsConfig()
    object.__setattr__(cfg, "stages", 12)  # past the estimate's guard
    with pytest.raises(ValueError, match="shared memory"):
        compile_logits(cfg)


def test_oracle_chunks_agree_with_one_pass(monkeypatch):
    """The oracle and the reference run in row chunks (the fp32 [rows, 64, S_kv] intermediate of a
    16384-token prefill is 17 GB): chunking changes nothing."""
    from kernels.indexer import glue

    x = _inputs(50, 37, 60)
    whole = (glue.oracle_of(**x), glue.lowprec_of(**x))
    monkeypatch.setattr(glue, "ORACLE_CHUNK_BYTES", 64 * 37 * 4 * 7)  # 7 rows per chunk
    torch.testing.assert_close(glue.oracle_of(**x), whole[0], rtol=0, atol=0)
    torch.testing.assert_close(glue.lowprec_of(**x), whole[1], rtol=0, atol=0)
