"""The gemm family on the CPU: the tile rule, bad input, the grouped oracle, and a fresh compile of
every configuration the rule picks for the DSV4 shapes (sm_90a from fake tensors)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels.gemm.config import CLUSTERS_RESIDENT, DRAM_BYTES_PER_CLK, H100_SMS, SMALL_M, choose_config, cost
from kernels.gemm.persistent_sm90 import tile_sum_rows
from kernels.gemm.tiling import SCALE_BOX, SMEM_BYTES, GemmConfig
from kernels.gemm.glue import check_cluster_round, check_operands, compile_gemm, make_operands, oracle_of, scales_for_tma
from oracles.linear import grouped_linear
from sweeps.gemm import LAYERS, TOKENS
from tests.gemm.tile_rule_checks import assert_no_worse_than_plain_tiles
from tests.wgmma_checks import assert_compiles_clean


def test_rule_prefill_takes_two_waves_and_decode_streams_the_weight():
    # prefill: tiles fill the SMs -> 256 x 128; too few wide tiles -> 128 x 128
    assert (choose_config(4096, 7168, 16384).bm, choose_config(4096, 7168, 16384).bn) == (256, 128)
    assert choose_config(4096, 512, 4096).bm == 128
    # decode: one M tile, the smallest x tile holding M, K blocks chained; where N gives few tiles,
    # split-K as clusters of 2-4 slices merging in shared memory, every cluster resident at once
    for m, bm in ((1, 16), (8, 16), (17, 32), (32, 32), (33, 64), (64, 64)):
        cfg = choose_config(m, 1024, 4096)
        assert cfg.bm == bm and 2 <= cfg.split_k <= 4 and cfg.cluster_k and cfg.chain == 8
        assert choose_config(m, 1024, 4096, min_rows=64).bm == 64  # 64-row x tiles (`cutedsl:x64`)
        assert -(-1024 // cfg.bn) <= CLUSTERS_RESIDENT[cfg.split_k]
        assert H100_SMS * 0.7 <= -(-1024 // cfg.bn) * cfg.split_k <= H100_SMS
    # several or taller M tiles merge their slices in global memory (v9's split: the cluster A/B measured
    # one M tile; a 128 x 128 partial a slice does not fit beside the ring)
    for m in (96, 128):
        cfg = choose_config(m, 512, 4096)
        assert cfg.bm == 64 and cfg.split_k > 1 and not cfg.cluster_k
    # ... but past M 64 only where even 64 x 32 tiles leave 3/4 of the SMs idle: one slice, full ring otherwise
    for m in (65, 96, 128):
        for n, k, bn in ((1536, 7168, 32), (4096, 8192, 64)):
            cfg = choose_config(m, n, k)
            assert (cfg.bm, cfg.bn, cfg.split_k) == (64, bn, 1) and cfg.n_stages == replace(cfg, stages=0).n_stages
    # M 129-256 (config.SMALL_M): 64- or 128-row tiles in one K slice, chained (DeepGEMM's pick at M 256)
    for m in (129, 192, 256):
        for n, k, bm, bn in ((512, 4096, 64, 32), (1536, 7168, 64, 64), (4096, 8192, 64, 128)):
            cfg = choose_config(m, n, k)
            assert (cfg.bm, cfg.bn, cfg.split_k, cfg.chain) == (bm, bn, 1, 8), (m, n, k)
    # ... where 64 x 192 and 128 x 128 tie in the model, the fewer padded rows: 64 x 192 at M 192, 128 x 128 at 256
    assert (choose_config(192, 7168, 16384).bm, choose_config(192, 7168, 16384).bn) == (64, 192)
    assert (choose_config(256, 7168, 16384).bm, choose_config(256, 7168, 16384).bn) == (128, 128)
    # ... and where they tie in rows too, the larger tile, chained: pro.shared_w13 at M 193-256
    for m in (193, 256):
        cfg = choose_config(m, 6144, 7168)
        assert (cfg.bm, cfg.bn, cfg.chain) == (128, 128, 8), m
    assert choose_config(4096, 7168, 16384).chain == 0  # two waves (two accumulators a warpgroup): no chains


def test_rule_takes_one_m_tile_at_the_widest_layers_below_257_rows():
    """config.one_m_tile: 256 x 128 tiles (unpaired) where the pick computed 256 rows anyway and the weight's DRAM
    floor binds: the wq_b layers and Pro's wo_a from M 193 (Pro's wo_a from 129, its pick there 128 x 128); the wq_b
    layers keep 64 x 192 up to M 192 (fewer padded rows), Flash's wo_a (64 tiles of 256 rows: half the SMs)
    128 x 128."""
    wide = {("flash", "wq_b"), ("pro", "wq_b"), ("pro", "wo_a")}
    for model, layer, n, k, g in LAYERS:
        for m in (129, 192, 193, 256):
            cfg = choose_config(m, n, k, groups=g)
            one = (model, layer) in wide and (m > 192 or layer == "wo_a")
            assert (cfg.bm == 256) == one and (cfg.bn, cfg.split_k, cfg.cluster_n, cfg.chain) == (
                (128, 1, 1, 0) if one else (cfg.bn, 1, 1, cfg.chain)), (model, layer, m, cfg)


@pytest.mark.parametrize("m", TOKENS)
def test_rule_configs_are_valid_and_no_worse_than_any_candidate(m):
    for _, _, n, k, _ in LAYERS:
        cfg = choose_config(m, n, k)
        assert cfg.stage_smem_bytes * cfg.n_stages + cfg.fixed_bytes <= SMEM_BYTES and cfg.n_stages >= 2
        model = cost
        if m in SMALL_M and cfg.bm == 256:  # config.one_m_tile's model: the weight's DRAM stream a common floor
            def model(m, n, k, bm, bn, split):
                return max(n * k / DRAM_BYTES_PER_CLK, cost(m, n, k, bm, bn, split, weight_stream=False))
        assert_no_worse_than_plain_tiles(model, cfg, m, n, k, [(64, 64), (128, 128), (128, 64)])


@pytest.mark.parametrize("fields, message", [
    ({"bm": 96}, "bm must be"), ({"bm": 256, "split_k": 2}, "split-K takes one wave"),
    ({"bm": 256, "bn": 128, "stages": 6}, "do not fit"), ({"bn": 96}, "bn must be"),
    ({"bm": 256, "bn": 192}, "bn 192 takes one wave"), ({"unroll": 3}, "unroll must be"),
    ({"cluster_k": True}, "split-K cluster takes 2-8 slices"), ({"cluster_k": True, "split_k": 9}, "2-8 slices"),
    ({"bm": 64, "bn": 128, "split_k": 8, "cluster_k": True}, "do not fit|leaves room"),
    ({"bm": 64, "x_box": 8}, "x_box takes"), ({"bm": 16, "x_box": 16}, "x_box takes"), ({"bm": 16, "x_box": 3}, "x_box"),
    ({"bm": 16, "bn": 32, "split_k": 2, "stamps": True}, "phase stamps take"),
])
def test_config_rejects_impossible_tiles(fields, message):
    with pytest.raises(ValueError, match=message):
        GemmConfig(**fields)


def test_rule_ships_the_unrolled_k_loop_and_the_unrolled_code_differs():
    """v7: every rule configuration runs its K-block loops unrolled 4x (docs/perf/gemm.md); the
    unroll reaches the compiled kernel (a different cubin from the v6 loop's, `cutedsl:unroll1`)."""
    from dsv4bench.compile.artifacts import artifact

    assert {choose_config(m, n, k, groups=g).unroll for _, _, n, k, g in LAYERS for m in TOKENS} == {4}
    cfg = choose_config(8, 4096, 4096)
    assert artifact(compile_gemm(cfg)) != artifact(compile_gemm(replace(cfg, unroll=1)))


def _ops(m=16, n=256, k=256, groups=1):
    return make_operands(m, n, k, 0, "cpu", groups)


@pytest.mark.parametrize("mutate, message", [
    (lambda x, sa, w, sw: (x[:, :200].contiguous(), sa, w, sw), "x has 200 columns, expected groups x K"),
    (lambda x, sa, w, sw: (x, sa, w[:, :200].contiguous(), sw), "K = 200 is not a positive multiple of 128"),
    (lambda x, sa, w, sw: (x.float(), sa, w, sw), "x must be float8_e4m3fn"),
    (lambda x, sa, w, sw: (x, sa.bfloat16(), w, sw), "sa must be a float32 tensor"),
    (lambda x, sa, w, sw: (x, sa[:, :1], w, sw), "sa must have shape (16, 2)"),
    (lambda x, sa, w, sw: (x, torch.ones(32, 2)[::2], w, sw), "sa must be contiguous or MN-major"),
    (lambda x, sa, w, sw: (x, sa, w, sw[:1]), "sw must have shape (2, 2)"),
    (lambda x, sa, w, sw: (x, sa, w, sw.t()), "sw must be contiguous"),
    (lambda x, sa, w, sw: (x.t(), sa, w, sw), "x must be"),
    (lambda x, sa, w, sw: (x, sa, w[::2], sw), "w must be contiguous"),
    (lambda x, sa, w, sw: (x, sa, w[:100].contiguous(), sw), "N = 100 must be a positive multiple of 8"),
])
def test_bad_input_is_one_error_naming_the_tensor(mutate, message):
    args = mutate(*_ops())
    with pytest.raises(ValueError) as e:
        check_operands(*args)
    assert message in str(e.value) and str(e.value).startswith("gemm: ")


def test_bad_output_and_groups_are_named():
    x, sa, w, sw = _ops()
    with pytest.raises(ValueError, match="gemm: out must be bfloat16"):
        check_operands(x, sa, w, sw, torch.empty(16, 256))
    with pytest.raises(ValueError, match=r"gemm: out must have shape \(16, 256\)"):
        check_operands(x, sa, w, sw, torch.empty(16, 128, dtype=torch.bfloat16))
    x, sa, w, sw = _ops(n=384, groups=3)
    assert check_operands(x, sa, w, sw, groups=3) == (16, 384, 256)
    with pytest.raises(ValueError, match="gemm: w N = 384 must be 2 groups"):
        check_operands(x[:, :512].contiguous(), sa[:, :4].contiguous(), w, sw, groups=2)


def test_grouped_oracle_is_one_product_per_group():
    x, sa, w, sw = _ops(m=5, n=384, k=256, groups=3)
    y = oracle_of(x, sa, w, sw, 3)
    xd = x.float() * sa.repeat_interleave(128, 1)
    wd = w.float() * sw.repeat_interleave(128, 0).repeat_interleave(128, 1)
    for g in range(3):
        ref = xd[:, g * 256:(g + 1) * 256] @ wd[g * 128:(g + 1) * 128].T
        torch.testing.assert_close(y[:, g * 128:(g + 1) * 128], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped_linear(xd[:, :256], wd, 1), xd[:, :256] @ wd.T)


RULE_CONFIGS = sorted({choose_config(m, n, k) for _, _, n, k, _ in LAYERS for m in TOKENS + (192, 300, 600)}, key=str)


@pytest.mark.parametrize("cfg", RULE_CONFIGS, ids=str)
def test_every_rule_config_compiles_without_spills_or_serialised_wgmma(cfg):
    assert_compiles_clean(compile_gemm, cfg)


CLUSTER_CONFIGS = [GemmConfig(16, 32, split_k=8, cluster_k=True, chain=8, stages=16),
                   GemmConfig(64, 64, split_k=5, cluster_k=True, chain=8, stages=8),
                   GemmConfig(128, 64, split_k=2, cluster_k=True)]


@pytest.mark.parametrize("cfg", CLUSTER_CONFIGS, ids=str)
def test_split_k_clusters_compile_without_spills_or_serialised_wgmma(cfg):
    assert_compiles_clean(compile_gemm, cfg)


@pytest.mark.parametrize("cfg", [GemmConfig(16, 32, chain=8, split_k=4, cluster_k=True, stages=16, stamps=True),
                                 GemmConfig(64, 64, chain=8, stamps=True)], ids=str)
def test_phase_stamps_compile_clean(cfg):
    """GemmConfig.stamps (benchmarks/gemm_phases.py): a split-K cluster and a plain chained tile."""
    assert_compiles_clean(compile_gemm, cfg)


def test_half_k_knock_out_issues_half_of_each_blocks_wgmmas():
    """cutedsl:ko-half-k (timed only): a chained decode tile's wgmma groups hold 2 QGMMAs where the rule's hold 4."""
    from dsv4bench.compile.sass import sass_of

    def group_sizes(c):
        sass = sass_of(compile_gemm(c))
        if sass is None:
            pytest.skip("no nvdisasm")
        sizes, n = set(), 0
        for line in sass.splitlines():
            if "QGMMA" in line:
                n += 1
                if "gsb0" in line:
                    sizes.add(n)
                    n = 0
        return sizes

    cfg = GemmConfig(16, 32, chain=8, split_k=4, cluster_k=True, stages=16)
    assert group_sizes(replace(cfg, ablate="half-k")) == {2} and group_sizes(cfg) == {4}


@pytest.mark.parametrize("cfg", [GemmConfig(16, 32, chain=8, pdl=True), GemmConfig(16, 32, split_k=4, cluster_k=True, pdl=True),
                                 GemmConfig(256, 128, cluster_n=2, pdl=True)], ids=str)
def test_pdl_configs_compile_without_spills_or_serialised_wgmma(cfg):
    """The PDL producer (weights before griddepcontrol.wait) for one CTA, a split-K cluster and a CTA pair."""
    assert_compiles_clean(compile_gemm, cfg)


def test_split_k_clusters_take_their_partials_from_shared_memory_and_one_round():
    cfg = GemmConfig(16, 32, split_k=8, cluster_k=True)
    assert cfg.partial_floats == 7 * 16 * 32 and cfg.fixed_bytes == GemmConfig(16, 32, split_k=8).fixed_bytes + 7 * 2048
    check_cluster_round(cfg, 1, 512, 132)  # 16 tiles x 8 slices = 128 CTAs
    with pytest.raises(ValueError, match="needs 136 CTAs in one round"):
        check_cluster_round(cfg, 1, 544, 132)
    with pytest.raises(ValueError, match="needs 128 CTAs in one round"):
        check_cluster_round(cfg, 1, 512, 127)  # 15 whole clusters


@pytest.mark.parametrize("k,groups", [(384, 1), (640, 3), (1024, 2)])
def test_scales_for_tma_keep_every_value(k, groups):
    """sa becomes MN-major with 16-byte aligned columns, sw rows whole TMA boxes (zero-padded)."""
    m, n = 5, 3 * 128
    kb = k // 128
    sa = torch.rand(m, groups * kb) + 0.5
    sw = torch.rand(n // 128, kb) + 0.5
    sa_t, sw_p = scales_for_tma(sa, sw, groups)
    assert torch.equal(sa_t, sa) and sa_t.stride() == (1, 8)  # M = 5 -> ld 8
    assert scales_for_tma(sa_t, sw, groups)[0] is sa_t  # already MN-major: no copy
    kbp = sw_p.shape[1]
    assert kbp % SCALE_BOX == 0 and torch.equal(sw_p[:, :kb], sw) and (sw_p[:, kb:] == 0).all()
    if kb % SCALE_BOX == 0:
        assert sw_p is sw  # DSV4's K: no copy


def test_the_compile_refuses_a_configuration_whose_shared_memory_does_not_fit():
    """n_stages is an estimate; the kernel's trace checks the real struct, so the CPU compile of every
    rule configuration (above) proves its shared memory fits."""
    cfg = GemmConfig(bm=256, bn=128)
    assert cfg.n_stages == 4  # the scale boxes leave room for a fourth 48 KB stage
    object.__setattr__(cfg, "stages", cfg.n_stages + 1)  # past the estimate's guard
    with pytest.raises(ValueError, match="shared memory"):
        compile_gemm(cfg)


def test_padded_weight_scales_are_made_once_per_weight():
    sa, sw = torch.rand(5, 3) + 0.5, torch.rand(2, 3) + 0.5  # K/128 = 3: padded to 4
    first = scales_for_tma(sa, sw)[1]
    assert scales_for_tma(sa, sw)[1] is first  # the same weight: no new copy
    sw.mul_(2)  # an in-place update of the weight scales is a new version
    again = scales_for_tma(sa, sw)[1]
    assert again is not first and torch.equal(again[:, :3], sw) and (again[:, 3:] == 0).all()


def test_cta_pairs_stay_inside_a_weight_group():
    """A CTA pair shares its x tile: grouped N tiles may pair only within one group."""
    from kernels.gemm.glue import pairs_share_x
    pair = GemmConfig(256, 128, cluster_n=2)
    assert pairs_share_x(pair, 8 * 1024, groups=8) and not pairs_share_x(pair, 3 * 384, groups=3)
    assert pairs_share_x(pair, 1000) and pairs_share_x(GemmConfig(256, 128), 3 * 384, groups=3)
    with pytest.raises(ValueError, match="bm 256"):
        GemmConfig(128, 128, cluster_n=2)


def test_rule_past_256_rows_weighs_bn192_and_64_row_tiles_against_unpaired_256():
    """M 257-768 (fewer than PAIR_MIN_M_TILES tiles of 256 rows, config.row_tiles): one K slice, no pairs; 128 x 192
    and 64-row tiles compete with 256 x 128, each where the H200 timed it fastest (M 300 / 400)."""
    for m in (257, 300, 400, 512, 600, 768):
        for _, _, n, k, g in LAYERS:
            cfg = choose_config(m, n, k, groups=g)
            assert cfg.split_k == 1 and cfg.cluster_n == 1 and cfg.chain == (8 if cfg.chainable else 0), (m, cfg)
    picks = {(300, 7168, 16384): (128, 192), (300, 1024, 4096): (64, 64), (300, 4096, 8192): (128, 128),
             (300, 6144, 7168): (128, 192), (400, 7168, 16384): (256, 128), (600, 4096, 8192): (128, 192)}
    for (m, n, k), tile in picks.items():
        assert (choose_config(m, n, k).bm, choose_config(m, n, k).bn) == tile, (m, n, k)
    for m in (1000, 4096):  # four or more M tiles of 256 rows: pairs where the model prices them cheapest
        cfg = choose_config(m, 7168, 16384)
        assert (cfg.bm, cfg.bn, cfg.cluster_n) == (256, 128, 2), m


def test_rule_pairs_ctas_only_where_x_is_reread():
    assert choose_config(4096, 7168, 16384).cluster_n == 2
    assert choose_config(512, 7168, 16384).cluster_n == 1  # 2 M tiles of 256: the weight stream binds
    assert choose_config(4096, 8 * 1024, 4096, groups=8).cluster_n == 2
    assert choose_config(4096, 3 * 384, 4096, groups=3).cluster_n == 1  # a pair would straddle a group


@pytest.mark.parametrize("tn", range(6))
def test_bn192_scale_parts_follow_the_weight_scale_blocks(tn):
    """Mirror of Fp8GemmSm90._read_scales / _col_part: a 192-column tile's column c takes the scale
    of weight-scale block (tn * 192 + c) // 128; its parts (0: the tile's first block, 1: the first
    for an even tile, the second for an odd one, 2: the second) say which, for every column a
    thread can hold (8 * (cc // 2) + 2 * (lane % 4) + cc % 2)."""
    from kernels.gemm.gemm_sm90 import Fp8GemmSm90

    kern = Fp8GemmSm90(GemmConfig(128, 192))
    first = (tn * 192) // 128
    for cc in range(48):
        for lane4 in range(4):
            col = 8 * (cc // 2) + 2 * lane4 + cc % 2
            block = (tn * 192 + col) // 128 - first
            part = kern._col_part(cc)
            assert block == {0: 0, 1: tn % 2, 2: 1}[part], (tn, cc, lane4)
    assert Fp8GemmSm90(GemmConfig(128, 128))._col_part(31) == 0


def test_bn192_is_taken_only_where_its_tiles_stay_inside_a_group():
    from kernels.gemm.glue import check_pairs

    assert choose_config(4096, 1536, 7168).bn == 192  # pro.wq_a: 2 waves of 128 x 192 against 2.9 of 128 x 128
    for groups, width in ((8, 1024), (3, 384), (16, 256)):
        assert choose_config(4096, groups * width, 1024, groups=groups).bn != 192 or width % 192 == 0
    with pytest.raises(ValueError, match="N tiles across a group boundary"):
        check_pairs(GemmConfig(128, 192), 3 * 256, 3)
    check_pairs(GemmConfig(128, 192), 3 * 384, 3)


def test_decode_rings_of_narrow_tiles_hold_at_most_64_kb_of_weight():
    from kernels.gemm.config import DECODE_RING_BYTES

    for _, _, n, k, g in LAYERS:
        for m in (*TOKENS, 96, 128):
            cfg = choose_config(m, n, k, groups=g)
            full = GemmConfig(bm=cfg.bm, bn=cfg.bn, split_k=cfg.split_k, cluster_k=cfg.cluster_k).n_stages  # beside partials
            if m <= 64 and cfg.bn <= 64:  # (M 65-256 full rings: SMALL_M, SPLIT_FILL)
                assert cfg.n_stages == min(full, DECODE_RING_BYTES // (cfg.bn * 128)), (m, n, k, cfg)
            else:
                assert cfg.n_stages == full, (m, n, k, cfg)  # bn 128 and prefill: as many as fit
    assert choose_config(1, 4096, 8192).n_stages == 16 and choose_config(1, 6144, 7168).n_stages == 8


def test_small_x_tiles_are_single_m_tile_one_wave_with_a_deeper_ring():
    for bm in (16, 32):
        cfg = GemmConfig(bm=bm, bn=64)
        assert (cfg.n_mma_wg, cfg.waves, cfg.x_rows, tile_sum_rows(cfg)) == (1, 1, bm, 64)
        # the last stage's wgmma reads 64 - bm rows past its tile: room kept for them
        assert cfg.fixed_bytes == GemmConfig(bm=64, bn=64).fixed_bytes + (64 - bm) * 128
        assert cfg.n_stages > GemmConfig(bm=64, bn=64).n_stages
        assert cfg.sa_slot * 4 % 128 == 0  # each stage's sa box lands 128-byte aligned (TMA)
        with pytest.raises(ValueError, match="single CTAs"):
            GemmConfig(bm=bm, bn=64, cluster_n=2)
    for fields in ({"bm": 256, "chain": 4}, {"bm": 16, "bn": 192, "chain": 4}, {"bm": 16, "chain": 3}):
        with pytest.raises(ValueError, match="chain"):
            GemmConfig(**fields)
    with pytest.raises(ValueError, match="for M <= 16 only"):
        from kernels.gemm.glue import run_gemm
        x, sa, w, sw = make_operands(17, 256, 256, 0)
        run_gemm(None, GemmConfig(bm=16, bn=64), x, sa, w, sw, torch.empty(17, 256, dtype=torch.bfloat16))


@pytest.mark.parametrize("x_rows, box_rows", [(16, 16), (32, 32), (16, 1), (16, 2), (16, 4), (16, 8), (32, 8)])
def test_small_x_views_run_the_wgmma_rows_onto_the_next_stages(x_rows, box_rows):
    """The wgmma's 64-row view of stage s is the TMA's x_rows-row tiles of stages s, s + 1, ...
    (swizzle included), and the shared memory it spans covers the last stage's 64 rows. A TMA box of
    box_rows < x_rows rows (GemmConfig.x_box) writes the first box_rows rows of each stage's tile."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.utils import LayoutEnum

    from kernels.gemm.gemm_sm90 import small_x_layouts

    stages = 5
    seen = {}

    @cute.jit
    def trace():
        std = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, 64, 128), cutlass.Float8E4M3FN, stages)
        mma, tma = small_x_layouts(std, x_rows, box_rows)
        seen["cosize"] = cute.cosize(mma)
        seen["box"] = cute.size(tma, mode=[0])
        seen["pairs"] = [(mma((r, c, s)), tma((r % x_rows, c, s + r // x_rows)), std((r, c, 0)) + s * x_rows * 128)
                         for s in range(stages) for r in range(64) for c in (0, 17, 64, 127)
                         if s + r // x_rows < stages and r % x_rows < box_rows]

    trace()
    assert seen["cosize"] == (stages - 1) * x_rows * 128 + 64 * 128
    assert seen["box"] == box_rows
    for wgmma_at, tma_at, standard_at in seen["pairs"]:
        assert wgmma_at == tma_at == standard_at  # the m64 operand as the standard layout's, shifted


def test_sa_to_box_views_the_padding_rows_only_where_the_storage_holds_them():
    """x_box's sa view: M rows of an ld = 4 buffer seen as 4 (the padding rows of each column), the values of the
    M real rows unchanged; a tensor whose storage ends at row M of its last column stays as it is."""
    from kernels.gemm.glue import mn_major_buffer, sa_to_box

    sa = mn_major_buffer(1, 6, "cpu")
    sa.copy_(torch.randn(1, 6))
    view = sa_to_box(sa, 4)
    assert view.shape == (4, 6) and view.stride() == (1, 4) and torch.equal(view[:1], sa)
    tight = torch.randn(5 * 4 + 1).as_strided((1, 6), (1, 4))  # storage ends at the last column's one value
    assert sa_to_box(tight, 4) is tight
    assert sa_to_box(sa, 8) is sa  # more rows than the column stride: as is
