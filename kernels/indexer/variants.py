"""Declared variants of the indexer logits kernel: the shipped configuration (kernels/indexer/config.py)
with one knob overridden, each `cutedsl:<name>`, timed through the harness beside the shipped rule
and the peers on the same inputs:

    dsv4bench sweep indexer --op logits --examples 0 --bench \\
        --impl cutedsl,cutedsl:coop,cutedsl:no-overlap,cutedsl:wg4,deepgemm

    coop      v1's schedule: both warpgroups share each 128-key tile, one tile in flight
    coop-overlap2  that, with two tiles in flight
    no-overlap     the shipped warpgroups taking 64-key tiles in turn, one tile in flight each
    overlapP  chains of P tiles (shipped: 2)
    wg1       one consumer warpgroup
    wg3, wg4  three / four consumer warpgroups sharing each tile (192 / 256 keys; four is
            DeepGEMM's layout: 112 registers a thread, the warp schedulers overlap their epilogues)
    wg4-pairs four warpgroups in two pairs, each pair a 128-key tile, the pairs taking tiles in turn
    wg4-solo  four warpgroups, each its own 64-key tile in turn
    pingpong  two warpgroups taking 64-key tiles in turn and turns to issue their wgmmas (named
            barriers: FA3's schedule), one tile in flight each
    bqB     B query tokens per block (wgmma N = 64 B; shipped 2; bq4: on v1's schedule, the only one
            whose registers hold it)
    sS      S KV ring stages instead of as many as fit (at most 8 a group)
    qs1     one Q stage: the next block's queries load only after this block is done

Every variant computes the real answer (it must pass the oracle). They are ablations of the logits
kernel: a top-k or decode case is UNSUPPORTED for them.

    fused     a select case (the decode top-k) on the fused kernels at every shape
    unfused   a select case as the unfused pair: the paged decode kernel writes the [B, W] logits,
            the top-k kernel reads them (the baseline the fusion must beat); the shipped op picks
            between the two (config.fuse_select)
Imported at the end of kernels/indexer/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

from dsv4bench.core.registry import register_impl
from kernels.indexer.family import IndexerCuteDSL
from kernels.knobs import ConfigKnobs
from kernels.indexer.select_glue import check_select, select
from sweeps.indexer import is_decode, is_select, is_topk

KNOBS: dict[str, dict] = {
    "coop": {"tile_wgs": 0, "overlap": 0},
    "coop-overlap2": {"tile_wgs": 0},
    "no-overlap": {"overlap": 0},
    "overlap3": {"overlap": 3},
    "overlap4": {"overlap": 4},
    "wg1": {"n_wg": 1},
    "wg3": {"n_wg": 3, "tile_wgs": 0, "overlap": 0},
    "wg4": {"n_wg": 4, "tile_wgs": 0, "overlap": 0},
    "wg4-pairs": {"n_wg": 4, "tile_wgs": 2, "overlap": 0},
    "wg4-solo": {"n_wg": 4, "overlap": 0},
    "pingpong": {"pingpong": True, "overlap": 0},
    "bq1": {"bq": 1},
    "bq4": {"bq": 4, "tile_wgs": 0, "overlap": 0},
    "s4": {"stages": 4},
    "qs1": {"q_stages": 1},
}


class IndexerKnob(ConfigKnobs, IndexerCuteDSL):
    """The shipped kernel with the rule's configuration overridden by `knobs`."""

    def supports(self, case, arch: str | None = None) -> str | None:
        if is_topk(case.params) or is_decode(case.params) or is_select(case.params):
            return (f"{self.name} is a configuration of the logits kernel (prefill); top-k, decode and select "
                    "have no such variants")
        return super().supports(case, arch)


class IndexerSelectRoute(IndexerCuteDSL):
    """`cutedsl:fused` / `cutedsl:unfused`: a select case on one route whatever config.fuse_select
    says (the fused kernels, or the paged decode kernel then the top-k kernel)."""

    def __init__(self, fused: bool):
        self.fused = fused
        self.variant = "fused" if fused else "unfused"
        self.name = f"cutedsl:{self.variant}"

    def supports(self, case, arch: str | None = None) -> str | None:
        if not is_select(case.params):
            return f"{self.name} is a route of a select case (the decode top-k)"
        return super().supports(case, arch)

    def run(self, case, inputs: dict, out: dict, compiled) -> dict:
        check_select(**inputs, width=case["s_kv"], k=case["k"], out=out["indices"])
        select(compiled, **inputs, width=case["s_kv"], out=out["indices"], fused=self.fused)
        return out


VARIANTS = tuple(IndexerKnob(name, knobs) for name, knobs in KNOBS.items()) + tuple(map(IndexerSelectRoute, (True, False)))
for _impl in VARIANTS:
    register_impl(_impl)
