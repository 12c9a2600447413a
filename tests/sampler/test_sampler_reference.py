"""Sampler on the CPU: the noise contract (peer equals oracle), ties at T = 0, temperature, and the
split plan covering the vocabulary."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import CaseData
from dsv4bench.core.registry import get_family
from kernels.sampler.sampler import TILE, SamplerKernel, plan
from sweeps import sampler as sspace
from tests.reference import run_reference

@pytest.mark.parametrize("params", [sspace.case(5, 0.6), sspace.case(7, 0.0), sspace.case(9, 1e-6, 1028),
                                    sspace.case(3, 2.0, 4)], ids=str)
def test_sampler_noise_contract_peer_equals_oracle(params):
    run_reference(Case("sampler", params, 6))


def test_sampler_greedy_inputs_have_ties_and_the_oracle_takes_the_lowest_index():
    data = CaseData(get_family("sampler"), Case("sampler", sspace.case(16, 0.0), 1), "cpu")
    logits = data.inputs["logits"]
    top = logits.max(-1, keepdim=True).values
    tied = (logits == top).sum(-1) > 1
    assert tied.any()  # bf16-rounded logits: T = 0 must break ties
    first = (logits == top).int().argmax(-1)  # first index of the maximum
    assert torch.equal(data.oracle["tokens"], first)


def test_sampler_temperature_changes_tokens():
    fam = get_family("sampler")
    cold = CaseData(fam, Case("sampler", sspace.case(64, 0.0), 2), "cpu").oracle["tokens"]
    hot = CaseData(fam, Case("sampler", sspace.case(64, 1.0), 2), "cpu").oracle["tokens"]
    assert (cold != hot).float().mean() > 0.5


def test_sampler_splits_cover_the_vocabulary():
    for v in (4, 1024, 1028, 129280, 160000):
        tiles = SamplerKernel(v).tiles
        assert tiles == -(-v // TILE)
        for rows in (1, 5, 64, 300):
            per_split, splits = plan(rows, tiles)
            assert (splits - 1) * per_split < tiles <= splits * per_split
    with pytest.raises(ValueError):
        SamplerKernel(1022)
