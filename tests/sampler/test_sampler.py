"""Sampler v3 (one launch, run-time splits, last-CTA merge): the split plan and the sm_90a / sm_100a
compiles on any machine; on a GPU (marked `gpu`) exact tokens against the oracle at B = 1, 33, 64,
256, ties across splits, T = 0 rows mixed with T > 0 rows, and consecutive calls that reuse one
workspace and one set of arrival counters (the merging CTA must leave its counter at zero)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.registry import get_family, get_impl
from dsv4bench.core.evaluate import case_generator
from kernels.sampler.eager import sample_with_noise
from kernels.sampler.sampler import TARGET_CTAS, TILE, SamplerKernel, counters, plan
from sweeps import sampler as space

ROWS = (1, 33, 64, 256)  # 33: odd, several splits; 256: one split per row (no merge)
TILES = SamplerKernel(space.VOCAB).tiles


@pytest.mark.parametrize("tiles", [1, 2, 7, TILES])
@pytest.mark.parametrize("rows", [1, 2, 3, 33, 64, 128, 255, 256, 257, 1000])
def test_plan_covers_every_tile_once(rows, tiles):
    per_split, splits = plan(rows, tiles)
    assert 1 <= splits <= tiles and (splits - 1) * per_split < tiles <= splits * per_split  # none empty
    assert rows * splits <= max(TARGET_CTAS, rows)  # about one resident wave


def test_plan_production():
    """The grids docs/perf/sampler.md models: B = 1 → 127 one-tile CTAs, B = 64 → 4 × 32 tiles."""
    assert TILES == 127 and TILE == 1024
    assert [plan(b, TILES) for b in (1, 33, 64, 128, 256)] == [(1, 127), (16, 8), (32, 4), (64, 2), (127, 1)]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("rows", ROWS)
def test_compiles_without_spills(rows, arch):
    """One compile serves every B (the split plan is computed at launch); ≤ 128 registers keeps two
    256-thread CTAs resident per SM, which TARGET_CTAS assumes."""
    case = Case("sampler", space.case(rows, 0.6))
    impl = get_impl("sampler", "cutedsl")
    assert impl.supports(case, arch) is None
    assert impl.compile_key(case, arch) == impl.compile_key(Case("sampler", space.case(1, 0.6)), arch)
    info = parse_cubin(impl.compile(case, arch).__cubin__)
    assert 0 < info.registers <= 128 and info.local_bytes == 0


# ---- GPU --------------------------------------------------------------------------------------

_compiled: dict = {}


def kernel_for(vocab: int):
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    if (vocab, arch) not in _compiled:
        _compiled[vocab, arch] = get_impl("sampler", "cutedsl").compile(Case("sampler", space.case(1, 0.6, vocab)), arch)
    return _compiled[vocab, arch]


def workspace(rows: int, vocab: int) -> dict:
    return get_family("sampler").alloc_outputs(Case("sampler", space.case(rows, 0.6, vocab)), "cuda")


def launch(logits, temps, noise, ws, cnt) -> torch.Tensor:
    ws["tokens"].fill_(-7)
    kernel_for(logits.shape[1])(logits, temps, noise, ws["partial_keys"], ws["partial_index"], cnt, ws["tokens"])
    torch.cuda.synchronize()
    return ws["tokens"].cpu()


def reference(logits, temps, noise) -> torch.Tensor:
    """The oracle's formula on the CPU with the given noise, per-row temperature (the family's lowprec)."""
    return sample_with_noise(logits.cpu(), temps.cpu(), noise.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.6, 0.0, 1.0])
@pytest.mark.parametrize("rows", ROWS)
def test_tokens_match_oracle_twice(rows, temperature):
    """The family's inputs and oracle (seeded noise); the same call twice on one workspace."""
    fam = get_family("sampler")
    case = Case("sampler", space.case(rows, temperature))
    inputs = fam.make_inputs(case, case_generator(case), "cuda")
    want = fam.oracle(case, inputs)["tokens"]
    ws, cnt = workspace(rows, space.VOCAB), counters(rows, "cuda")
    for _ in range(2):
        assert torch.equal(launch(inputs["logits"], inputs["temperatures"], inputs["noise"], ws, cnt), want)
        assert int(cnt[:rows].abs().sum()) == 0, "an arrival counter was left non-zero"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 33, 64])
def test_ties_pick_the_lowest_index_across_splits(rows):
    """The row maximum repeated in different splits (and the last column); constant noise makes the
    keys tie at T > 0 too. Row r: columns r, 40000 + r, V − 1 hold the maximum → token r. One row is
    all equal → 0."""
    v = space.VOCAB
    logits = torch.zeros(rows, v)
    for r in range(rows):
        logits[r, [r, 40000 + r, v - 1]] = 3.0
    logits[rows // 2] = -1.5
    temps = torch.tensor([(0.0, 0.6, 1e-6)[r % 3] for r in range(rows)])
    noise = torch.ones(rows, v)
    want = torch.arange(rows)
    want[rows // 2] = 0
    ws, cnt = workspace(rows, v), counters(rows, "cuda")
    got = launch(logits.cuda(), temps.cuda(), noise.cuda(), ws, cnt)
    assert torch.equal(got, want) and torch.equal(got, reference(logits, temps, noise))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 33, 64, 256])
def test_mixed_temperatures_greedy_rows_ignore_noise(rows):
    """Per-row T in {0, 0.6, 1e-6, 2}; the T = 0 rows' noise is NaN (used, it would change the token)."""
    v = space.VOCAB
    gen = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows, v, generator=gen) * 2.0).to(torch.bfloat16).float()
    noise = torch.empty(rows, v).exponential_(1, generator=gen)
    temps = torch.tensor([(0.0, 0.6, 1e-6, 2.0)[r % 4] for r in range(rows)])
    want = reference(logits, temps, noise)
    noise[temps == 0] = float("nan")
    ws, cnt = workspace(rows, v), counters(rows, "cuda")
    assert torch.equal(launch(logits.cuda(), temps.cuda(), noise.cuda(), ws, cnt), want)


@pytest.mark.gpu
def test_workspace_reused_across_calls_and_batch_sizes():
    """64 rows, then 1 row, then 64 other rows on one workspace and one counter buffer: each call is
    exact and leaves every counter at zero (a counter left at k would make a later row merge early)."""
    v = space.VOCAB
    ws64, cnt = workspace(64, v), torch.zeros(64, dtype=torch.int32, device="cuda")
    for seed, rows in ((1, 64), (2, 1), (3, 64), (4, 33)):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(rows, v, generator=gen) * 3.0
        noise = torch.empty(rows, v).exponential_(1, generator=gen)
        temps = torch.full((rows,), 0.6)
        ws = {k: t[:rows] for k, t in ws64.items()}
        assert torch.equal(launch(logits.cuda(), temps.cuda(), noise.cuda(), ws, cnt), reference(logits, temps, noise))
        assert int(cnt.abs().sum()) == 0
