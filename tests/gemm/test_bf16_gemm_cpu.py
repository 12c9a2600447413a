"""The bf16 GEMM (kernels/gemm/bf16_sm90.py) on the CPU: its tile rule, bad input, the sweep op's
registration (cases, oracle, peers), and a fresh compile of every configuration the rule picks for
the model's shapes, plus each tile shape and split-K, for sm_90a from fake tensors (no spills, no
serialised wgmma)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions, get_family, get_impl
from kernels.gemm.bf16_config import BK, Bf16Config, choose_bf16_config, cost
from kernels.gemm.bf16_glue import bf16_oracle, check_bf16_operands, compile_bf16_gemm, draw_bf16_operands, fake_args
from kernels.gemm.config import H100_SMS, MAX_SPLIT
from kernels.gemm.tiling import SMEM_BYTES
from sweeps.gemm import BF16, BF16_GROUPED, BF16_LAYERS, BF16_M
from tests.gemm.tile_rule_checks import assert_no_worse_than_plain_tiles
from tests.wgmma_checks import assert_compiles_clean

HEAD = 129280


def test_rule_streams_the_head_from_every_sm_and_splits_small_decode_gemms():
    for d in (4096, 7168):
        for m in (1, 8, 64):
            cfg = choose_bf16_config(m, HEAD, d)
            assert cfg.bm == 64 and cfg.split_k == 1 and -(-HEAD // cfg.bn) >= H100_SMS
        for n in (512, 1024, 2048):  # the compressors (wkv + wgate stacked)
            cfg = choose_bf16_config(1, n, d)
            assert cfg.bm == 64 and -(-n // cfg.bn) * cfg.split_k >= H100_SMS * 0.8, (n, cfg)
        assert choose_bf16_config(1, 64, d).split_k == MAX_SPLIT  # weights_proj: one tile, split all it may
    prefill = choose_bf16_config(4096, 2048, 4096)
    assert (prefill.bm, prefill.bn, prefill.split_k) == (128, 256, 1)


@pytest.mark.parametrize("m", BF16_M)
def test_rule_configs_fit_and_are_no_worse_than_the_plain_tiles(m):
    for _, _, n, k in BF16_LAYERS:
        cfg = choose_bf16_config(m, n, k)
        assert cfg.n_stages * cfg.stage_bytes + 2048 <= SMEM_BYTES and cfg.n_stages >= 2
        assert_no_worse_than_plain_tiles(cost, cfg, m, n, k, [(64, 64), (64, 128), (128, 128), (128, 256)])


@pytest.mark.parametrize("fields, message", [
    ({"bm": 256}, "bm must be"), ({"bn": 32}, "bn must be"), ({"bm": 128, "bn": 256, "stages": 6}, "do not fit"),
])
def test_config_rejects_impossible_tiles(fields, message):
    with pytest.raises(ValueError, match=message):
        Bf16Config(**fields)


def _ops(m=5, n=40, k=72):
    return draw_bf16_operands(m, n, k, 0)


@pytest.mark.parametrize("mutate, message", [
    (lambda x, w: (x.float(), w), "x must be bfloat16"),
    (lambda x, w: (x, w.half()), "w must be bfloat16"),
    (lambda x, w: (x.t(), w), "x must be contiguous"),
    (lambda x, w: (x, w[:, :64].contiguous()), "w has K = 64, x has K = 72"),
    (lambda x, w: (x[:, :70].contiguous(), w[:, :70].contiguous()), "K = 70 is not a positive multiple of 8"),
    (lambda x, w: (x[:0], w), "x has M = 0"),
    (lambda x, w: (x[0], w), "x must be a 2-D tensor"),
])
def test_bad_input_is_one_error_naming_the_tensor(mutate, message):
    x, w = mutate(*_ops())
    with pytest.raises(ValueError) as e:
        check_bf16_operands(x, w)
    assert message in str(e.value) and str(e.value).startswith("gemm bf16: ")


def test_bad_output_is_named():
    x, w = _ops()
    assert check_bf16_operands(x, w, torch.empty(5, 40)) == (5, 40, 72)
    assert check_bf16_operands(x, w, torch.empty(5, 40, dtype=torch.bfloat16)) == (5, 40, 72)
    with pytest.raises(ValueError, match="gemm bf16: out must be float32 or bfloat16"):
        check_bf16_operands(x, w, torch.empty(5, 40, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"gemm bf16: out must have shape \(5, 40\)"):
        check_bf16_operands(x, w, torch.empty(5, 41))
    with pytest.raises(ValueError, match="out must have contiguous rows"):
        check_bf16_operands(x, w, torch.empty(40, 5).t())


def test_the_shared_split_k_workspace_sizes_both_kernels_configs():
    """glue.workspace serves the bf16 kernel and the FP8 one (whose config alone carries phase stamps): a split-K
    tile's fp32 sums for each, zeroed, one buffer for one device however it is named."""
    from kernels.gemm.glue import workspace
    from kernels.gemm.tiling import GemmConfig

    work, count = workspace(Bf16Config(bm=64, bn=128, split_k=3), 100, 1000, "cpu")
    assert work.numel() >= 2 * 8 * 64 * 128 and count.numel() >= 16 and not work.any()
    fp8, _ = workspace(GemmConfig(16, 64, split_k=4), 16, 7168, torch.device("cpu"))
    assert fp8.numel() >= 112 * 64 * 64 and fp8.data_ptr() == workspace(Bf16Config(), 1, 64, "cpu")[0].data_ptr()


def test_the_sweep_op_is_registered_with_its_shapes_oracle_and_peers():
    fam = get_family("gemm")
    cases = fam.cases(SweepOptions(examples=8, seed=3, filters=fam.parse_filters({"op": "bf16"})))
    assert cases and all(c["op"] == BF16 for c in cases)
    grid = {(c["m"], c["n"], c["k"], c.get("groups", 1)) for c in cases if c.origin == "grid"}
    assert grid == ({(m, n, k, 1) for _, _, n, k in BF16_LAYERS for m in BF16_M}
                    | {(m, n, k, g) for _, _, n, k, g in BF16_GROUPED for m in BF16_M})
    drawn = [c for c in cases if c.origin == "hypothesis"]
    assert drawn and all(c["k"] % 8 == 0 for c in drawn)
    assert any(c["k"] % BK or c["n"] % 64 or c["m"] % 64 for c in drawn)  # ragged draws
    # the FP8 cases of a seed are what they were (the bf16 draws have their own seed stream)
    fp8 = fam.cases(SweepOptions(examples=8, seed=3, grid=False, filters=fam.parse_filters({"op": "gemm"})))
    assert all("op" not in c.params for c in fp8) and fp8

    case = Case("gemm", {"m": 7, "n": 100, "k": 200, "op": BF16, "layer": "drawn"})
    inputs = fam.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
    x, w = inputs["x"], inputs["w"]
    assert x.dtype == w.dtype == torch.bfloat16 and x.shape == (7, 200) and w.shape == (100, 200)
    truth = fam.oracle(case, inputs)["out"]
    assert truth.dtype == torch.float32
    torch.testing.assert_close(truth, x.double().matmul(w.double().T).float(), rtol=1e-5, atol=1e-5)
    assert fam.lowprec(case, inputs)["out"].dtype == torch.bfloat16
    assert fam.alloc_outputs(case, "cpu")["out"].dtype == torch.float32
    assert fam.cost(case).bytes == 2 * 7 * 200 + 2 * 100 * 200 + 4 * 7 * 100
    torch.testing.assert_close(get_impl("gemm", "torch").run(case, inputs, {}, None)["out"], truth)
    assert get_impl("gemm", "cutedsl").supports(case, "sm_90a") is None
    assert "sm_100a" not in get_impl("gemm", "cutedsl").archs
    for peer in ("deepgemm", "cublaslt", "cutedsl:bm128", "cutedsl:ko-no-b"):
        assert get_impl("gemm", peer).supports(case, "sm_90a"), peer
    odd = Case("gemm", {"m": 7, "n": 100, "k": 100, "op": BF16})
    assert "multiple of 8" in get_impl("gemm", "cutedsl").supports(odd, "sm_90a")


def test_oracle_is_the_fp32_product_and_the_lowprec_yardstick_holds_on_the_cpu():
    x, w = draw_bf16_operands(33, 300, 1000, 5)
    y = bf16_oracle(x, w)
    exact = x.double() @ w.double().T
    assert (y.double() - exact).abs().max() <= 1000 * 2.0**-24 * (x.double().abs() @ w.double().abs().T).max()
    assert (y.bfloat16().double() - exact).abs().max() > 0  # the yardstick is not the truth


@pytest.mark.parametrize("group_n", [0, 192])
def test_fake_operands_tie_x_to_w_columns_only_when_ungrouped(group_n):
    """A symbol two fake tensors share becomes a shape check of the compiled call (tvm-ffi, on the GPU
    only): grouped, x has G*K columns against W's K, and a shared K refused every wo_a call
    (docs/lessons/gemm.md 10)."""
    x, w, y, *_ = fake_args(Bf16Config(bm=64, bn=64, group_n=group_n))
    assert (x.shape[1] is w.shape[1]) == (not group_n)
    assert x.shape[0] is y.shape[0] and w.shape[0] is y.shape[1]


def test_grouped_operands_oracle_and_refusals():
    """Grouped (wo_a): x [M, G*K], W [G*Ng, K]; the oracle is each group's product (the reference's
    einsum), the tile rule keeps an N tile inside one group, and what would straddle groups is refused."""
    x, w = draw_bf16_operands(9, 3 * 128, 192, 4, groups=3)
    assert x.shape == (9, 3 * 192) and check_bf16_operands(x, w, torch.empty(9, 384), groups=3) == (9, 384, 192)
    y = bf16_oracle(x, w, 3)
    for g in range(3):
        torch.testing.assert_close(y[:, 128 * g:128 * (g + 1)], x[:, 192 * g:192 * (g + 1)].float()
                                   @ w[128 * g:128 * (g + 1)].float().T, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(y, x[:, :192].float() @ w.float().T)  # not the plain product of group 0's x
    for m in BF16_M:
        for _, _, n, k, g in BF16_GROUPED:
            cfg = choose_bf16_config(m, n, k, groups=g)
            assert cfg.group_n == n // g and cfg.group_n % cfg.bn == 0
    assert choose_bf16_config(1, 3 * 64, 192, groups=3).bn == 64  # 64 columns a group: only bn 64 fits
    for bad, message in (((x, w, None, 2), "x has 576 columns, expected groups x K = 2 x 192"),
                         ((x[:, :3 * 72].contiguous(), w[:, :72].contiguous(), None, 3), "whole 64-column K blocks"),
                         ((x, w[:3 * 96].contiguous(), None, 3), "3 groups of a multiple of 64 rows")):
        with pytest.raises(ValueError, match=message):
            check_bf16_operands(*bad)
    with pytest.raises(ValueError, match="group_n must be a multiple of bn"):
        Bf16Config(bm=64, bn=256, group_n=128)
    impl = get_impl("gemm", "cutedsl")
    case = Case("gemm", {"m": 5, "n": 3 * 96, "k": 192, "groups": 3, "op": BF16})
    assert "whole tiles a group" in impl.supports(case, "sm_90a")
    case = Case("gemm", {"m": 5, "n": 3 * 128, "k": 192, "groups": 3, "op": BF16})
    assert impl.supports(case, "sm_90a") is None and impl.config(case).group_n == 128
    fam = get_family("gemm")
    assert fam.cost(case).bytes == 2 * 5 * 3 * 192 + 2 * 384 * 192 + 4 * 5 * 384
    inputs = fam.make_inputs(case, torch.Generator().manual_seed(2), "cpu")
    assert inputs["x"].shape == (5, 3 * 192) and inputs["w"].shape == (384, 192)
    truth = fam.oracle(case, inputs)["out"]
    torch.testing.assert_close(truth, bf16_oracle(inputs["x"], inputs["w"], 3))
    peer = get_impl("gemm", "torch").run(case, inputs, {}, None)["out"]  # the reference's bf16 einsum
    assert peer.dtype == torch.float32 and (peer - truth).abs().max() <= 2.0**-7 * truth.abs().max()


RULE_CONFIGS = sorted({choose_bf16_config(m, n, k) for _, _, n, k in BF16_LAYERS for m in BF16_M}
                      | {choose_bf16_config(m, n, k, groups=g) for _, _, n, k, g in BF16_GROUPED for m in BF16_M},
                      key=str)
# every tile shape, with and without split-K, beyond what the rule picks for the model's shapes
TILE_CONFIGS = sorted({Bf16Config(bm=bm, bn=bn, split_k=s) for bm in (64, 128) for bn in (64, 128, 256)
                       for s in (1, 3)} - set(RULE_CONFIGS), key=str)


@pytest.mark.parametrize("cfg", RULE_CONFIGS, ids=str)
def test_every_rule_config_compiles_without_spills_or_serialised_wgmma(cfg):
    assert_compiles_clean(compile_bf16_gemm, cfg)


@pytest.mark.parametrize("cfg", TILE_CONFIGS, ids=str)
def test_every_tile_shape_compiles_clean(cfg):
    assert_compiles_clean(compile_bf16_gemm, cfg)


@pytest.mark.parametrize("cfg", [Bf16Config(bm=64, bn=256), Bf16Config(bm=128, bn=128, split_k=2)], ids=str)
def test_bf16_output_compiles_clean(cfg):
    assert_compiles_clean(lambda c: compile_bf16_gemm(c, torch.bfloat16), cfg)


def test_tile_variants_override_one_knob_of_the_rule_and_refuse_the_fp8_cases():
    case = Case("gemm", {"m": 1, "n": HEAD, "k": 4096, "op": BF16})
    rule = choose_bf16_config(1, HEAD, 4096)
    narrow = get_impl("gemm", "cutedsl:bf16-bn128")
    assert narrow.supports(case, "sm_90a") is None and narrow.config(case) == Bf16Config(bm=rule.bm, bn=128)
    assert get_impl("gemm", "cutedsl:bf16-k8").config(case).split_k == 8
    assert "do not fit" in get_impl("gemm", "cutedsl:bf16-s8").supports(case, "sm_90a")  # 8 x 40 KB stages
    fp8 = Case("gemm", {"m": 1, "n": 1024, "k": 4096})
    assert "bf16 tile variant" in narrow.supports(fp8, "sm_90a")
    key = narrow.compile_key(case, "sm_90a")
    assert key != get_impl("gemm", "cutedsl").compile_key(case, "sm_90a") and Bf16Config(bm=64, bn=128) in key
