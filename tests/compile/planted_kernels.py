"""A small SM90 KV-loading kernel with the seed notes' three silent bugs, each plantable on its own.

A producer warp TMA-loads K and V tiles (d, tile_n) of a (d, n_kv, heads) view through a
PipelineTmaAsync; consumer warps wait for each stage and release it, then a PipelineAsync hands a
"done" token from the producer warp to the consumers. Bugs (bug=...):
  "slice"   the TMA-partitioned K is sliced (None, None, 0, 0): the KV-tile mode (2) pinned to 0
  "tx"      the KV barrier's tx_count counts K bytes only (the missing-V deadlock)
  "arrive"  the PipelineAsync consumer count is the warp count, not the thread count
bug=None is the correct twin. Compiles on a CPU for sm_90a; never run. PlantedFamily / PlantedImpl
wrap it as a kernel family (registered as a plugin by planted_family.py) with one case per bug.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import make_fake_compact_tensor
from cutlass.tensor_utils import LayoutEnum

from kernels import trace as rec
from dsv4bench.core.case import Case
from dsv4bench.core.registry import Cost, Family, Impl

BUGS = ("slice", "tx", "arrive")


class KvLoadKernel:
    def __init__(self, d: int = 64, tile_n: int = 64, stages: int = 2, consumer_warps: int = 4, bug: str | None = None):
        assert bug in (None, *BUGS)
        self.d, self.tile_n, self.stages, self.consumer_warps, self.bug = d, tile_n, stages, consumer_warps, bug

    @cute.jit
    def __call__(self, mK: cute.Tensor, mV: cute.Tensor):
        layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (self.d, self.tile_n, self.tile_n),
                                               mK.element_type, self.stages)
        one_stage = cute.slice_(layout, (None, None, 0))
        tile = (self.d, self.tile_n)
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK, one_stage, tile)
        tma_v, tma_mV = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mV, one_stage, tile)
        stage_bytes = cute.size_in_bytes(mK.element_type, one_stage)
        tx_count = stage_bytes if cutlass.const_expr(self.bug == "tx") else 2 * stage_bytes

        @cute.struct
        class Storage:
            kv_bar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            done_bar: cute.struct.MemRange[cutlass.Int64, 2]
            sK: cute.struct.Align[cute.struct.MemRange[mK.element_type, cute.cosize(layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[mV.element_type, cute.cosize(layout)], 1024]

        self.storage = Storage
        rec.record("smem K/V staged", layout)
        rec.record("TMA atom K", tma_k)
        self.kernel(tma_k, tma_mK, tma_v, tma_mV, layout, tx_count).launch(
            grid=(1, 1, 1), block=(32 * (1 + self.consumer_warps), 1, 1))

    @cute.kernel
    def kernel(self, tma_k: cute.CopyAtom, tma_mK: cute.Tensor, tma_v: cute.CopyAtom, tma_mV: cute.Tensor,
               layout: cute.ComposedLayout, tx_count: cutlass.Constexpr):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = memory.SmemAllocator().allocate(self.storage)
        sK = storage.sK.get_tensor(layout.outer, swizzle=layout.inner)
        sV = storage.sV.get_tensor(layout.outer, swizzle=layout.inner)

        kv_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_warps)  # one lane per warp
        kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.kv_bar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread), consumer_group=kv_consumers,
            tx_count=tx_count, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        done_consumers = pipeline.CooperativeGroup(
            pipeline.Agent.Thread, self.consumer_warps * (1 if cutlass.const_expr(self.bug == "arrive") else 32))
        done = pipeline.PipelineAsync.create(
            barrier_storage=storage.done_bar.data_ptr(), num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32), consumer_group=done_consumers)
        rec.record_barrier("KV stage", tx_count, loads={"K": sK[None, None, 0], "V": sV[None, None, 0]})
        rec.record_pipeline("KV", pipeline.PipelineTmaAsync, kv_consumers, consumer_warps=self.consumer_warps)
        rec.record_pipeline("done", pipeline.PipelineAsync, done_consumers, consumer_warps=self.consumer_warps)

        # (d, n_kv, heads) tiled by (d, tile_n): ((d, tile_n), d tiles = 1, KV tiles, heads)
        gK = cute.local_tile(tma_mK, (self.d, self.tile_n), (None, None, None))
        gV = cute.local_tile(tma_mV, (self.d, self.tile_n), (None, None, None))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        rec.record("sK", sK)
        k_coord = (None, None, 0, 0) if cutlass.const_expr(self.bug == "slice") else (None, 0, None, 0)
        tKgK = rec.record_tma_slice("K tile after TMA partition", tKgK, k_coord, tile_mode=2)
        tVgV = rec.record_tma_slice("V tile after TMA partition", tVgV, (None, 0, None, 0), tile_mode=2)
        n_tiles = cute.size(gK, mode=[2])

        if warp == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for kt in cutlass.range(n_tiles, unroll=1):
                kv.producer_acquire(state)
                cute.copy(tma_k, tKgK[None, kt], tKsK[None, state.index], tma_bar_ptr=kv.producer_get_barrier(state))
                cute.copy(tma_v, tVgV[None, kt], tVsV[None, state.index], tma_bar_ptr=kv.producer_get_barrier(state))
                kv.producer_commit(state)
                state.advance()
            token = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            done.producer_acquire(token)
            done.producer_commit(token)
        else:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            for kt in cutlass.range(n_tiles, unroll=1):
                kv.consumer_wait(state)
                kv.consumer_release(state)
                state.advance()
            token = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            done.consumer_wait(token)
            done.consumer_release(token)


def fake_kv(n_kv, d: int = 64, heads: int = 1):
    """A fake bf16 (d, n_kv, heads) view of row-major (heads, n_kv, d) memory; n_kv may be symbolic."""
    return make_fake_compact_tensor(cutlass.BFloat16, (d, n_kv, heads), stride_order=(0, 1, 2), assumed_align=16)


def compile_planted(bug: str | None, n_kv=256, arch: str = "sm_90a"):
    kernel = KvLoadKernel(bug=bug)
    return cute.compile(kernel, fake_kv(n_kv), fake_kv(n_kv), options=f"--gpu-arch {arch} --enable-tvm-ffi")


class PlantedFamily(Family):
    """Cases: the correct twin, then one per bug (--bug slice|tx|arrive picks one)."""

    name = "planted"

    def cases(self, opts):
        return [Case(self.name, {"bug": b}) for b in opts.filters.get("bug", [None, *BUGS])]

    def parse_filters(self, raw):
        if set(raw) - {"bug"} or raw.get("bug", BUGS[0]) not in BUGS:
            raise ValueError(f"planted takes --bug {'|'.join(BUGS)}")
        return {"bug": [raw["bug"]]} if raw else {}

    def make_inputs(self, case, gen, device):
        return {"x": torch.randn(4, generator=gen).to(device)}

    def oracle(self, case, inputs):
        return {"out": inputs["x"].float()}

    lowprec = oracle

    def alloc_outputs(self, case, device):
        return {}

    def cost(self, case):
        return Cost(0.0, 0.0)


class PlantedImpl(Impl):
    family, name, backend, compiles = "planted", "cutedsl", "cutedsl", True

    def compile_key(self, case, arch):
        return (self.family, self.name, arch, case["bug"])

    def compile(self, case, arch):
        return compile_planted(case["bug"], arch=arch)

    def run(self, case, inputs, out, compiled):
        raise AssertionError("a linted kernel must never run")
