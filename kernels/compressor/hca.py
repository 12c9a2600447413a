"""HCA (m = 128) pooling with the entry split over several CTAs (spec §5.3-§5.5).

One CTA per entry (v1) gave ⌊S/128⌋ CTAs, about one per SM at S = 16384, each streaming 512 KiB:
52 % of copy. Here `splits` CTAs share an entry, each pooling 128 / splits tokens with `groups`
thread groups of d/4 lanes (a thread: 4 channels, one online softmax state each; the groups meet
in shared memory). The partial states (max, sum, weighted sum per channel) are merged by the
last-arriving CTA of the entry, in the same launch:

- each CTA stores its state to the fp32 scratch part[b, s, split, 3, d] (6 KiB at d = 512, written
  to and read back from L2), fences (release, GPU scope), and one thread adds 1 to the entry's
  counter; the CTA that sees old = splits − 1 fences (acquire), loads the `splits` states in
  split order (deterministic, whatever the arrival order), folds them, and runs the
  post-processing of `EntryKernel.finish`.
- the merging CTA sets the entry's counter back to 0: nothing else touches it in this launch, and
  the next launch on the stream starts after this one, so every call starts from a zeroed buffer
  (allocated zeroed; a launch that dies mid-way takes the CUDA context, and the buffer, with it).

A second, merging kernel was the alternative: it costs a launch and a grid-wide dependency
(~2-4 µs on a 23 µs copy floor) and runs every merge after the last token is read, while here the
merges of early entries overlap the streaming of later ones. One source for sm_90a and sm_100a.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import torch
from cutlass import Float32, Int32

from kernels.compressor.compressor import VEC, EntryKernel

SPLITS = 8  # CTAs per entry: 1024 CTAs of 128 threads at S = 16384
STATE = 3  # max, sum, weighted sum
_COUNTERS: dict = {}


def counters(n: int, device) -> torch.Tensor:
    """A zeroed int32 buffer of >= n entry counters on `device`, kept across calls: every launch
    leaves it zeroed again (see module doc). One buffer per device: two HCA launches running at
    once on different streams would share it, which the harness (one stream) never does."""
    buf = _COUNTERS.get(str(device))
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1 << 12), dtype=torch.int32, device=device)
        _COUNTERS[str(device)] = buf
    return buf


class HcaKernel(EntryKernel):
    """Compile-time: m, d, eps, splits (CTAs per entry), groups (thread groups per CTA)."""

    def __init__(self, m: int, d: int, eps: float = 1e-6, splits: int = SPLITS, groups: int = 1):
        super().__init__(m, d, eps, groups)
        if m % (splits * groups):
            raise ValueError(f"splits·groups = {splits * groups} must divide m = {m}")
        self.splits = splits
        self.per_group = m // (splits * groups)

    @cute.jit
    def __call__(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor,
                 mOut: cute.Tensor, mPart: cute.Tensor, mCount: cute.Tensor, stream):
        self.kernel(mKv, mScore, mW, mTab, mOut, mPart, mCount).launch(
            grid=[self.splits, mOut.shape[1], mOut.shape[0]], block=[self.lanes * self.groups, 1, 1],
            stream=stream,
        )

    @cute.jit
    def pool(self, mKv: cute.Tensor, mScore: cute.Tensor, first, b, lane, mx, l, acc):
        """Online softmax over tokens first .. first + per_group − 1."""
        gKv = cute.zipped_divide(mKv, (1, 1, VEC))  # ((1,1,4), (B, S, d/4))
        gSc = cute.zipped_divide(mScore, (1, 1, VEC))
        kv = cute.make_rmem_tensor((VEC,), Float32)
        z = cute.make_rmem_tensor((VEC,), Float32)
        mx.fill(-Float32.inf)
        l.fill(0.0)
        acc.fill(0.0)
        for j in cutlass.range(self.per_group, unroll=4):
            cute.autovec_copy(gKv[(0, 0, None), (b, first + j, lane)], kv)
            cute.autovec_copy(gSc[(0, 0, None), (b, first + j, lane)], z)
            self.absorb(kv, z, mx, l, acc)

    @cute.jit
    def merge_groups(self, smem, mx, l, acc, group, lane):
        """Every group ends with the CTA's merged state (groups folded in order through shared memory)."""
        s_part = smem.allocate_tensor(Float32, cute.make_layout((STATE, self.groups, self.d)), 16)
        for i in cutlass.range_constexpr(VEC):
            s_part[0, group, lane * VEC + i] = mx[i]
            s_part[1, group, lane * VEC + i] = l[i]
            s_part[2, group, lane * VEC + i] = acc[i]
        cute.arch.barrier()
        for i in cutlass.range_constexpr(VEC):
            mx[i] = s_part[0, 0, lane * VEC + i]
            l[i] = s_part[1, 0, lane * VEC + i]
            acc[i] = s_part[2, 0, lane * VEC + i]
        other = cute.make_rmem_tensor(cute.make_layout((STATE, VEC), stride=(VEC, 1)), Float32)
        for g in cutlass.range_constexpr(1, self.groups):
            for k in cutlass.range_constexpr(STATE):
                for i in cutlass.range_constexpr(VEC):
                    other[k, i] = s_part[k, g, lane * VEC + i]
            self.combine(mx, l, acc, other[0, None], other[1, None], other[2, None])
        cute.arch.barrier()

    @cute.kernel
    def kernel(self, mKv: cute.Tensor, mScore: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor,
               mPart: cute.Tensor, mCount: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        split, s, b = cute.arch.block_idx()
        group, lane = tidx // self.lanes, tidx % self.lanes
        mx = cute.make_rmem_tensor((VEC,), Float32)
        l = cute.make_rmem_tensor((VEC,), Float32)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        smem = memory.SmemAllocator()  # the one allocator of the kernel (no aliasing)
        self.pool(mKv, mScore, s * self.m + (split * self.groups + group) * self.per_group, b, lane, mx, l, acc)
        if cutlass.const_expr(self.groups > 1):
            self.merge_groups(smem, mx, l, acc, group, lane)

        y = cute.make_rmem_tensor((VEC,), Float32)
        if cutlass.const_expr(self.splits == 1):
            for i in cutlass.range_constexpr(VEC):
                y[i] = acc[i] / l[i]
            self.finish(smem, y, mW, mTab, mOut, b, s, group, lane)
        else:
            gPart = cute.zipped_divide(mPart, (1, 1, 1, 1, VEC))  # ((…, 4), (B, E, splits, 3, d/4))
            if group == 0:
                cute.autovec_copy(mx, gPart[(0, 0, 0, 0, None), (b, s, split, 0, lane)])
                cute.autovec_copy(l, gPart[(0, 0, 0, 0, None), (b, s, split, 1, lane)])
                cute.autovec_copy(acc, gPart[(0, 0, 0, 0, None), (b, s, split, 2, lane)])
            cute.arch.fence_acq_rel_gpu()
            cute.arch.barrier()
            s_old = smem.allocate_tensor(Int32, cute.make_layout((1,)), 4)
            if tidx == 0:
                s_old[0] = cute.arch.atomic_add(mCount.iterator + (b * mOut.shape[1] + s), Int32(1))
            cute.arch.barrier()
            if s_old[0] == self.splits - 1:  # the last CTA of the entry
                cute.arch.fence_acq_rel_gpu()
                if tidx == 0:
                    mCount[b * mOut.shape[1] + s] = Int32(0)  # the next call starts from zero
                state = cute.make_rmem_tensor(cute.make_layout((STATE, VEC), stride=(VEC, 1)), Float32)
                for p in cutlass.range_constexpr(self.splits):
                    for k in cutlass.range_constexpr(STATE):
                        cute.autovec_copy(gPart[(0, 0, 0, 0, None), (b, s, p, k, lane)], state[k, None])
                    if cutlass.const_expr(p == 0):
                        mx.store(state[0, None].load())
                        l.store(state[1, None].load())
                        acc.store(state[2, None].load())
                    else:
                        self.combine(mx, l, acc, state[0, None], state[1, None], state[2, None])
                for i in cutlass.range_constexpr(VEC):
                    y[i] = acc[i] / l[i]
                self.finish(smem, y, mW, mTab, mOut, b, s, group, lane)
