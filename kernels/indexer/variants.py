"""Declared variants of the indexer logits kernel: the shipped configuration (kernels/indexer/config.py)
with one knob overridden, each `cutedsl:<name>`, timed through the harness beside the shipped rule
and the peers on the same inputs:

    dsv4bench sweep indexer --tokens 4096,16384 --examples 0 --bench \\
        --impl cutedsl,cutedsl:bq1,cutedsl:bq4,cutedsl:wg1,deepgemm,torch

    bqB     B query tokens per block (wgmma N = 64 B; shipped 2)
    wg1     one consumer warpgroup (64-key tiles) instead of two
    sS      S KV ring stages instead of as many as fit (at most 8)
    qs1     one Q stage: the next block's queries load only after this block is done
    wg3, wg4  three / four consumer warpgroups sharing each tile (192 / 256 keys; four is
            DeepGEMM's layout: 112 registers a thread, the warp schedulers overlap their epilogues)
    wg4-pairs four warpgroups in two pairs, each pair a 128-key tile, the pairs taking tiles in turn
    wg4-solo  four warpgroups, each its own 64-key tile in turn
    wg2-free  two warpgroups, each its own 64-key tile in turn, without ping-pong's turn barriers
    wg2-free-bq4  and 4 query tokens a block
    overlapP  two tiles in flight per warpgroup: the next tile's wgmmas run under this tile's
            epilogue (two accumulators), in chains of P tiles
    wg2-free-overlapP  wg2-free and overlapP
    pingpong  64-key stages owned alternately by the two consumer warpgroups, which take turns to
            issue their wgmmas (named barriers): one's epilogue runs under the other's wgmmas
            (the shipped cooperative kernel lets them fall into step: docs/lessons/fmha.md 17)
    pingpong-bq4  both

Every variant computes the real answer (it must pass the oracle). They are ablations of the logits
kernel: a top-k or decode case is UNSUPPORTED for them.
Imported at the end of kernels/indexer/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

from dsv4bench.core.registry import register_impl
from kernels.indexer.family import IndexerCuteDSL
from kernels.knobs import ConfigKnobs
from sweeps.indexer import is_decode, is_topk

KNOBS: dict[str, dict] = {
    "bq1": {"bq": 1},
    "bq4": {"bq": 4},
    "wg1": {"n_wg": 1},
    "wg3": {"n_wg": 3},
    "wg4": {"n_wg": 4},
    "wg4-pairs": {"n_wg": 4, "tile_wgs": 2},
    "wg4-solo": {"n_wg": 4, "tile_wgs": 1},
    "wg2-free": {"n_wg": 2, "tile_wgs": 1},
    "wg2-free-bq4": {"n_wg": 2, "tile_wgs": 1, "bq": 4},
    "overlap2": {"overlap": 2},
    "overlap3": {"overlap": 3},
    "overlap4": {"overlap": 4},
    "wg2-free-overlap2": {"n_wg": 2, "tile_wgs": 1, "overlap": 2},
    "wg2-free-overlap4": {"n_wg": 2, "tile_wgs": 1, "overlap": 4},
    "s2": {"stages": 2},
    "s4": {"stages": 4},
    "qs1": {"q_stages": 1},
    "pingpong": {"pingpong": True},
    "pingpong-bq4": {"pingpong": True, "bq": 4},
}


class IndexerKnob(ConfigKnobs, IndexerCuteDSL):
    """The shipped kernel with the rule's configuration overridden by `knobs`."""

    def supports(self, case, arch: str | None = None) -> str | None:
        if is_topk(case.params) or is_decode(case.params):
            return f"{self.name} is a configuration of the logits kernel (prefill); top-k and decode have no variants"
        return super().supports(case, arch)


VARIANTS = tuple(IndexerKnob(name, knobs) for name, knobs in KNOBS.items())
for _impl in VARIANTS:
    register_impl(_impl)
