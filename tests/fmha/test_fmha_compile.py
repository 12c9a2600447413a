"""The SM90 kernel compiles for sm_90a on a machine without a GPU (fake tensors), at every head
dim, in a bounded time, without local-memory spills; its layouts are recorded by name."""

import time

import pytest

from dsv4bench.compile.cubin import parse_cubin
from kernels.trace import recording
from kernels.fmha.config import Config
from kernels.fmha.compiling import compile_config
from kernels.fmha.glue import block_indices

CONFIGS = [
    Config(d=512, dv=512, hpg=128, kv_shared=True, per_token_idx=True),  # DSV4 Pro prefill / decode
    Config(d=512, dv=512, hpg=64, kv_shared=False, per_token_idx=False, causal=True),
    Config(d=256, dv=256, hpg=1, kv_shared=False, per_token_idx=False),
    Config(d=128, dv=128, hpg=20, kv_shared=False, per_token_idx=False, causal=True),  # heads not filling M
    Config(d=64, dv=64, hpg=3, kv_shared=True, per_token_idx=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"d{c.d}-hpg{c.hpg}-{'tok' if c.per_token_idx else 'blk'}")
def test_compiles_for_sm90a_without_gpu(cfg):
    t0 = time.perf_counter()
    with recording() as rec:
        compiled = compile_config(cfg, "sm_90a")
    seconds = time.perf_counter() - t0
    layouts = {e["stage"]: e["fields"] for e in rec.entries}
    info = parse_cubin(compiled.__cubin__)
    print(cfg, f"{seconds:.1f}s", info)
    assert seconds < 120, "compile time blew up (unrolled pipeline loop?)"
    assert info.cubin_bytes > 0
    assert not info.local_bytes, f"register spills: {info.local_bytes} B of local memory"
    for name in ("smem K stages (keys, d, stage) K-major", "S as (rows, cols) of this thread (acc_S_mn)",
                 "P as PV operand A (tOrP)"):
        assert name in layouts
    assert f"Shape MNK:       (64,{cfg.n_block},16)" in str(layouts["tiled MMA S = Q K^T (per warpgroup)"])



def test_unsupported_head_dims_are_refused():
    with pytest.raises(ValueError):
        Config(d=96, dv=96, hpg=1, kv_shared=False, per_token_idx=False)
    with pytest.raises(ValueError):
        Config(d=384, dv=384, hpg=1, kv_shared=False, per_token_idx=False)


def test_block_indices_cover_every_row_mask():
    import torch

    from oracles.fmha import window_mask

    for s_q, s_kv, tq, causal, window in [(10, 17, 4, True, None), (9, 5, 2, True, 3), (7, 30, 3, False, 4),
                                          (5, 5, 8, False, None)]:
        blk, lens = block_indices(s_q, s_kv, tq, causal, window, "cpu")
        assert all(int((blk[i] >= 0).sum()) == int(lens[i]) for i in range(blk.shape[0]))
        mask = window_mask(s_q, s_kv, window, causal)
        for t in range(s_q):
            keys = {int(j) for j in blk[t // tq] if j >= 0}
            assert {int(j) for j in torch.nonzero(mask[t])[:, 0]} <= keys
