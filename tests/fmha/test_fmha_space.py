"""The fmha case space covers what the issue asks for, the CLI filters parse (and refuse bad
input with one line), and the generated index lists mean what the params say."""

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import SweepOptions
from kernels.fmha.family import FAMILY, n_keys, sparse_indices
from sweeps import fmha as space


def test_production_grid_covers_the_issue():
    grid = space.production()
    dense = [p for p in grid if p["mask"] != "sparse"]
    sparse = [p for p in grid if p["mask"] == "sparse" and p.get("op") is None]  # FP8 decode: test_decode_fp8.py
    for hd in (64, 128, 256, 512):
        for mask in ("none", "causal", "window", "causal_window"):
            assert {p["sink"] for p in dense if p["hd"] == hd and p["mask"] == mask} == {False, True}
    assert any(p["s_q"] > p["s_kv"] for p in dense) and any(p["s_q"] < p["s_kv"] for p in dense)
    assert any(p["h_q"] // p["h_kv"] not in (1, 64, 128) for p in dense)  # heads that do not fill M
    assert any(p["s_q"] == 1 for p in dense)  # decode, heads packed into M
    for h_q, topk in ((64, 640), (128, 1152)):  # Flash / Pro: prefill and decode
        assert {p["kv_layout"] for p in sparse if p["h_q"] == h_q and p["topk"] == topk} == {"shared", "per_token"}
    assert any(p["invalid"] > 0 for p in sparse)
    assert {p["select"] for p in sparse} >= {"random", "hca", "none"}


def test_filters_parse_and_refuse_bad_input():
    f = FAMILY.parse_filters({"hd": "64,512", "sink": False, "mask": "topk,causal", "heads": "128"})
    assert f == {"hd": [64, 512], "sink": [False], "mask": ["sparse", "causal"], "heads": [128]}
    for bad in ({"hd": "64,abc"}, {"hd": "96"}, {"sink": "maybe"}, {"mask": "diagonal"}, {"width": "7168"}):
        with pytest.raises(ValueError) as e:
            FAMILY.parse_filters(bad)
        assert "\n" not in str(e.value)
    cases = FAMILY.cases(SweepOptions(examples=0, filters=FAMILY.parse_filters({"hd": "512", "mask": "topk"})))
    assert cases and all(c["hd"] == 512 and c["mask"] == "sparse" for c in cases)


def test_sparse_index_lists_mean_what_the_params_say():
    g = torch.Generator().manual_seed(0)
    case = Case("fmha", space._sparse(h_q=64, s_q=300, topk=128 + 40, invalid=0.25))
    idx = sparse_indices(case, g)
    assert idx.shape == (300, 168)
    t = 200  # window part: raw positions t-127 .. t; selected part: compressed rows >= s_q
    assert sorted(idx[t, 40:].tolist()) == list(range(t - 127, t + 1))
    sel = idx[:, :40]
    assert ((sel == -1) | (sel >= 300)).all() and 0.15 < float((sel == -1).float().mean()) < 0.35
    dec = sparse_indices(Case("fmha", space._sparse(h_q=128, s_q=8, topk=16, window=0, kv_layout="per_token")), g)
    for r in range(8):  # every request owns its own rows
        assert sorted(dec[r].tolist()) == list(range(16 * r, 16 * r + 16))


def test_causal_cost_counts_half_the_keys():
    full = Case("fmha", space._dense(128, "none", b=1, h_q=1, h_kv=1, s_q=256, s_kv=256))
    causal = Case("fmha", space._dense(128, "causal", b=1, h_q=1, h_kv=1, s_q=256, s_kv=256))
    assert n_keys(full) == 256 and n_keys(causal) == pytest.approx(128.5)
    assert FAMILY.cost(causal).flops == pytest.approx(FAMILY.cost(full).flops * 128.5 / 256)
