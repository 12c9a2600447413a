"""The TMA ring the wgmma kernels (gemm, moe, indexer) feed their consumers through: one producer
thread, `consumer_warps` warps releasing each stage; a CTA of its own, or one of a cluster whose
CTAs multicast into each other's stages (then a stage is free when every CTA's consumers released it)."""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.pipeline as pipeline


def tma_ring(barriers, stages: int, consumer_warps: int, tx_bytes: int,
             cluster_n: int = 1) -> pipeline.PipelineTmaAsync:
    """A PipelineTmaAsync over `stages` slots whose full barrier expects `tx_bytes` of TMA
    transactions; initialisation is deferred (the caller fences with pipeline_init_arrive/wait).
    cluster_n > 1: the CTAs of a (1 x cluster_n) cluster write into each other's stages, so each
    consumer warp releases a stage in every CTA of the cluster (lane r signals rank r)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps * cluster_n),
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, 1, cluster_n, 1)),
        defer_sync=True,
    )


def consumer_state(stages: int, g, masks: bool = False):
    """The consumer's ring state for the g-th stage it takes (slot g % stages, phase (g // stages) % 2). masks: g >= 0
    and `stages` a power of two, so slot and phase are an AND and a shift (a signed g % stages is ~6 instructions)."""
    if masks:
        if stages & (stages - 1):
            raise ValueError(f"masks needs a power-of-two ring, got {stages} stages")
        return pipeline.PipelineState(stages, g, g & (stages - 1), (g >> (stages.bit_length() - 1)) & 1)
    return pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
