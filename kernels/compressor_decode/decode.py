"""The compressor's decode-time kernels (spec §5.5, §5.7): the state update of one token and the
post-processing of given raw entries.

`PushKernel`, one token t of B sequences (the reference's `CompressorState.push`):

    state[b, off + t mod m] ← (kv_t, z_t)                          off = m for CSA, 0 for HCA
    when (t + 1) mod m = 0:  entry[b] = Σ softmax(z) · kv over the block's candidates
        HCA (m = 128): the m slots;  CSA (m = 4): the own block's b-halves (channels [d, 2d) of slots
        [m, 2m)) and the previous block's a-halves (channels [0, d) of slots [0, m)), 8 candidates;
        then (CSA) state[:m] ← state[m:], the current block becomes the previous one.

The state is the reference's fp32 kv / score pair [B, coff·m, coff·d], updated in place (score −inf
where nothing was written: the previous block of block 0). t is a runtime scalar and the emission a
uniform branch on it, so one compiled kernel serves every position and the host reads nothing. A CTA
owns 128 channels of one sequence (32 lanes of 4 channels; CSA: a lane owns channel c of both halves,
so the shift needs no other thread) and `groups` thread groups split the slots (HCA: 8 groups of 16
slots, the partial softmax states folded in order through shared memory). Group 0 writes the token,
a barrier, then every group pools from the state (the candidates in L2: the token's write is 2·coff·d
fp32 per sequence; an emission reads the block once). The pooling reuses `EntryKernel.absorb` /
`combine` (the prefill kernels' online softmax; the own block first, so that the −inf of an absent
previous block folds in as an exact zero).

`PostKernel`, raw entries c [N, d] fp32 with their table rows (RoPE at s·m) → fp32 [N, d]: RMSNorm
and RoPE (`EntryKernel.norm_rope`), then the main compressor's FP8 NoPE qdq (`EntryKernel.quantise`)
or, for the indexer (d = 128), Hadamard_128 then FP4 (e2m1, ue8m0 per 32) qdq: a CTA of d/4 threads
an entry, as the prefill kernels' post-processing. The output is fp32 (the oracle's): the quantised
values are exact in any format, the RoPE channels are not rounded. One source for sm_90a and sm_100a.

The shared pieces are the compressor family's (kernels/compressor/compressor.py `EntryKernel`, fp8.py,
hca.py's state layout) and the quant family's e2m1 rounding (kernels/quant/numerics.py `e2m1_code`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
from cutlass import Float32, Int32

from kernels.compressor.compressor import VEC, EntryKernel
from kernels.compressor.fp8 import pow2_ceil
from kernels.compressor.hca import STATE
from kernels.quant.numerics import e2m1_code
from oracles.compressor import INDEXER_FP4_BLOCK, overlaps
from oracles.quant import E2M1_GRID, FP4_AMAX_FLOOR, FP4_E2M1_MAX

LANES = 32  # channel vectors (of 4) per CTA: 128 channels
HCA_GROUPS = 8  # thread groups splitting HCA's 128 slots
INDEXER_D = 128  # the indexer's entry width: one Hadamard_128 over a warp


class PushKernel(EntryKernel):
    """Compile-time: m, d (the entry width; the state is coff·d wide), groups (slot split)."""

    def __init__(self, m: int, d: int, groups: int | None = None):
        super().__init__(m, d)
        self.csa = overlaps(m)
        self.groups = groups or (1 if self.csa else HCA_GROUPS)
        if self.csa and self.groups != 1:
            raise ValueError("the CSA push pools 8 candidates in one group")
        if m % self.groups:
            raise ValueError(f"{self.groups} groups do not divide the {m} slots")
        self.per_group = m // self.groups
        self.chunks = d // (VEC * LANES)

    @cute.jit
    def __call__(self, mKv: cute.Tensor, mScore: cute.Tensor, mKvT: cute.Tensor, mScoreT: cute.Tensor,
                 mOut: cute.Tensor, t: Int32, stream):
        self.kernel(mKv, mScore, mKvT, mScoreT, mOut, t).launch(
            grid=[self.chunks, mKvT.shape[0], 1], block=[LANES * self.groups, 1, 1], stream=stream,
        )

    @cute.kernel
    def kernel(self, mKv: cute.Tensor, mScore: cute.Tensor, mKvT: cute.Tensor, mScoreT: cute.Tensor,
               mOut: cute.Tensor, t: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        chunk, b, _ = cute.arch.block_idx()
        group, lane = tidx // LANES, tidx % LANES
        cv = chunk * LANES + lane  # this lane's channel vector in [0, d/4)
        m, half = self.m, self.d // VEC
        offset = m if self.csa else 0
        slot = t % m
        gKv = cute.zipped_divide(mKv, (1, 1, VEC))  # ((1,1,4), (B, slots, W/4))
        gSc = cute.zipped_divide(mScore, (1, 1, VEC))
        gKvT = cute.zipped_divide(mKvT, (1, VEC))  # ((1,4), (B, W/4))
        gScT = cute.zipped_divide(mScoreT, (1, VEC))
        n_halves = 2 if self.csa else 1
        tok = cute.make_rmem_tensor((VEC,), Float32)
        if group == 0:
            for h in cutlass.range_constexpr(n_halves):
                cute.autovec_copy(gKvT[(0, None), (b, h * half + cv)], tok)
                cute.autovec_copy(tok, gKv[(0, 0, None), (b, offset + slot, h * half + cv)])
                cute.autovec_copy(gScT[(0, None), (b, h * half + cv)], tok)
                cute.autovec_copy(tok, gSc[(0, 0, None), (b, offset + slot, h * half + cv)])
        if (t + 1) % m == 0:
            if cutlass.const_expr(self.groups > 1):
                cute.arch.barrier()  # the token's slot, written by group 0, is read by every group
            mx = cute.make_rmem_tensor((VEC,), Float32)
            l = cute.make_rmem_tensor((VEC,), Float32)
            acc = cute.make_rmem_tensor((VEC,), Float32)
            mx.fill(-Float32.inf)
            l.fill(0.0)
            acc.fill(0.0)
            if cutlass.const_expr(self.csa):
                self.pool_csa(gKv, gSc, b, cv, mx, l, acc)
            else:
                kv = cute.make_rmem_tensor((VEC,), Float32)
                z = cute.make_rmem_tensor((VEC,), Float32)
                for j in cutlass.range(self.per_group, unroll=4):
                    cute.autovec_copy(gKv[(0, 0, None), (b, group * self.per_group + j, cv)], kv)
                    cute.autovec_copy(gSc[(0, 0, None), (b, group * self.per_group + j, cv)], z)
                    self.absorb(kv, z, mx, l, acc)
                if cutlass.const_expr(self.groups > 1):
                    self.merge(mx, l, acc, group, lane)
            if group == 0:
                y = cute.make_rmem_tensor((VEC,), Float32)
                for i in cutlass.range_constexpr(VEC):
                    y[i] = acc[i] / l[i]
                cute.autovec_copy(y, cute.zipped_divide(mOut, (1, VEC))[(0, None), (b, cv)])

    @cute.jit
    def pool_csa(self, gKv, gSc, b, cv, mx, l, acc):
        """The 8 candidates of channel vector cv, then the shift state[:m] ← state[m:] of its channels.
        Every load is issued before the first is consumed."""
        m, half = self.m, self.d // VEC
        kv = cute.make_rmem_tensor(cute.make_layout((VEC, 2, 2 * m), stride=(1, VEC, 2 * VEC)), Float32)
        z = cute.make_rmem_tensor(cute.make_layout((VEC, 2, 2 * m), stride=(1, VEC, 2 * VEC)), Float32)
        for j in cutlass.range_constexpr(2 * m):  # the previous block's a-halves, the own block's both halves
            for h in cutlass.range_constexpr(2):
                if cutlass.const_expr(j >= m or h == 0):
                    cute.autovec_copy(gKv[(0, 0, None), (b, j, h * half + cv)], kv[None, h, j])
                    cute.autovec_copy(gSc[(0, 0, None), (b, j, h * half + cv)], z[None, h, j])
        for j in cutlass.range_constexpr(m):  # the own block's b-halves: finite scores
            self.absorb(kv[None, 1, m + j], z[None, 1, m + j], mx, l, acc)
        for j in cutlass.range_constexpr(m):  # the previous block's a-halves (−inf at block 0: weight 0)
            self.absorb(kv[None, 0, j], z[None, 0, j], mx, l, acc)
        for j in cutlass.range_constexpr(m):
            for h in cutlass.range_constexpr(2):
                cute.autovec_copy(kv[None, h, m + j], gKv[(0, 0, None), (b, j, h * half + cv)])
                cute.autovec_copy(z[None, h, m + j], gSc[(0, 0, None), (b, j, h * half + cv)])

    @cute.jit
    def merge(self, mx, l, acc, group, lane):
        """Group 0 ends with the groups' softmax states folded in group order (shared memory)."""
        smem = memory.SmemAllocator()
        s_part = smem.allocate_tensor(Float32, cute.make_layout((STATE, self.groups, LANES * VEC)), 16)
        for i in cutlass.range_constexpr(VEC):
            s_part[0, group, lane * VEC + i] = mx[i]
            s_part[1, group, lane * VEC + i] = l[i]
            s_part[2, group, lane * VEC + i] = acc[i]
        cute.arch.barrier()
        if group == 0:
            other = cute.make_rmem_tensor(cute.make_layout((STATE, VEC), stride=(VEC, 1)), Float32)
            for g in cutlass.range_constexpr(1, self.groups):
                for k in cutlass.range_constexpr(STATE):
                    for i in cutlass.range_constexpr(VEC):
                        other[k, i] = s_part[k, g, lane * VEC + i]
                self.combine(mx, l, acc, other[0, None], other[1, None], other[2, None])


class PostKernel(EntryKernel):
    """Compile-time: d, eps, indexer (Hadamard + FP4 instead of the FP8 NoPE qdq). Entries: runtime."""

    def __init__(self, d: int, eps: float = 1e-6, indexer: bool = False):
        super().__init__(1, d, eps)
        if indexer and d != INDEXER_D:
            raise ValueError(f"the indexer's post-processing is a Hadamard over {INDEXER_D} channels, got d = {d}")
        self.indexer = indexer

    @cute.jit
    def __call__(self, mC: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor, stream):
        self.kernel(mC, mW, mTab, mOut).launch(grid=[mC.shape[0], 1, 1], block=[self.lanes, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mC: cute.Tensor, mW: cute.Tensor, mTab: cute.Tensor, mOut: cute.Tensor):
        lane, _, _ = cute.arch.thread_idx()
        r, _, _ = cute.arch.block_idx()
        y = cute.make_rmem_tensor((VEC,), Float32)
        cute.autovec_copy(cute.zipped_divide(mC, (1, VEC))[(0, None), (r, lane)], y)
        self.norm_rope(memory.SmemAllocator(), y, mW, mTab, r, 0, lane)
        if cutlass.const_expr(self.indexer):
            hadamard_fp4(y, lane)
        else:
            self.quantise(y, lane)
        cute.autovec_copy(y, cute.zipped_divide(mOut, (1, VEC))[(0, None), (r, lane)])


@cute.jit
def hadamard_fp4(y, lane):
    """In place on a 128-wide row held by one warp, 4 fp32 values a lane (element 4·lane + i):
    x ← fp4_qdq(x·H_128·128^-0.5, block 32). The butterfly runs on element bits 0-1 in registers and
    bits 2-6 across lanes (xor shuffles: a + b on the lane whose bit is clear, a − b on its partner);
    then each block of 32 (8 lanes) gets its ue8m0 scale 2^ceil(log2(amax·fp32(1/6))) (amax floored at
    6·2^-126) and every value the e2m1 value nearest x / scale (ties to even), times the scale."""
    for h in (1, 2):
        for i in [i for i in range(VEC) if not i & h]:
            a, b = y[i], y[i + h]
            y[i], y[i + h] = a + b, a - b
    for offset in (1, 2, 4, 8, 16):
        sign = cutlass.select_((lane & offset) == 0, Float32(1.0), Float32(-1.0))
        for i in cutlass.range_constexpr(VEC):
            y[i] = y[i] * sign + cute.arch.shuffle_sync_bfly(y[i], offset=offset)
    norm = Float32(INDEXER_D**-0.5)
    amax = Float32(0.0)
    for i in cutlass.range_constexpr(VEC):
        y[i] = y[i] * norm
        amax = cute.arch.fmax(amax, cute.math.absf(y[i]))
    for offset in (4, 2, 1):  # 8 lanes = one block of 32
        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
    scale = pow2_ceil(cute.arch.fmax(amax, Float32(FP4_AMAX_FLOOR)) * Float32(1.0 / FP4_E2M1_MAX))
    for i in cutlass.range_constexpr(VEC):
        code = e2m1_code(y[i] / scale)
        y[i] = e2m1_value(code) * scale


@cute.jit
def e2m1_value(code: Int32) -> Float32:
    """The value of an e2m1 code (bit 3 the sign; magnitudes oracles.quant.E2M1_GRID): a select chain."""
    c = code & 7
    mag = Float32(0.0)
    for k in cutlass.range_constexpr(1, len(E2M1_GRID)):
        mag = cutlass.select_(c == k, Float32(E2M1_GRID[k]), mag)
    return cutlass.select_((code & 8) != 0, -mag, mag)


assert INDEXER_FP4_BLOCK == 32  # hadamard_fp4's blocks are 8 lanes of 4 values
