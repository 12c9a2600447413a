"""The TMA ring both wgmma kernels (gemm, indexer) feed their consumers through: one producer
thread, `consumer_warps` warps releasing each stage, a CTA of its own (no cluster)."""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.pipeline as pipeline


def tma_ring(barriers, stages: int, consumer_warps: int, tx_bytes: int) -> pipeline.PipelineTmaAsync:
    """A PipelineTmaAsync over `stages` slots whose full barrier expects `tx_bytes` of TMA
    transactions; initialisation is deferred (the caller fences with pipeline_init_arrive/wait)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        defer_sync=True,
    )
