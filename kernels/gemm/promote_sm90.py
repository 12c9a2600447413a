"""v6 candidate (not the default): the FP8 GEMM with its promotion overlapped by the warpgroup's own
wgmmas (`cutedsl:promote-split`, kernels/gemm/variants.py; docs/perf/gemm.md, "v6 candidate").

The shipped consumer (gemm_sm90.py `_mainloop`) runs, per K block and wave: 4 wgmma m64n{bn}k32 into
one temporary, wait_group(0), promote. While it promotes, its own queue on the tensor core is empty;
only the other warpgroup's wgmmas can fill it. A second full temporary (issue the next block before
promoting this one) does not fit beside bm 256's two accumulators (2 x 64 + 2 x 64 registers of the
232) and ptxas serialised it at v1 (docs/lessons/gemm.md 1).

Here the temporary is split by columns into two halves of bn/2 (the same 64 registers at bn 128):
each (K block, wave) is two units, 4 wgmma m64n{bn/2}k32 each, one commit group per unit, and the
units form one software pipeline over the tile's K blocks:

    issue(u0)
    for each unit u:   issue(u + 1) into the other half   (the next K block's first unit: after
                                                            waiting for its stage and reading its scales)
                       wait_group(1)                       (u's group done; u + 1 stays in flight)
                       release the stage after its last unit
                       promote u's half into its columns of the wave's accumulator

so every promotion burst (half the shipped one) runs while the next unit's 4 wgmmas are queued on
the tensor core, but one per chain: the pipeline runs over chains of `chain` K blocks unrolled at
compile time, each ending in wait_group(0), because a group left in flight across the K loop's back
edge made ptxas serialise every wgmma of the kernel (C7514; docs/lessons/gemm.md 9). At bm 256 that
leaves one exposed half burst per 8 units (the shipped kernel: every burst, full width).

The cost: every A tile is read from shared memory twice (once per half) and each wgmma is half as
wide (n64 at bn 128: 128 B/clock of operand reads at the tensor core's rate against 96 for n128; the
GPU A/B decides whether that binds).

Everything else (producer, scales in the stage, epilogue, pairs, split-K) is the shipped kernel: this
class overrides only `_consumer` (the half-width MMAs and B fragments) and `_mainloop`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup

from kernels.gemm.gemm_sm90 import Fp8GemmSm90
from kernels.gemm.tiling import KBLOCK
from kernels.regs import fence_operand, mn_view

HALVES = 2  # column halves of the temporary: units per (K block, wave)


class PromoteSplitSm90(Fp8GemmSm90):
    """The shipped kernel with the per-unit software pipeline above (checked: the oracle's answer)."""

    chain = 2  # K blocks per pipeline chain: no wgmma group is in flight across the loop's back edge

    def _consumer(self, tiled_mma, sA, sB, tidx):
        """As the shipped consumer entry (registers, thread index, full-width MMA slice for the
        accumulator's shape), but the fragments are the half-width MMA's: `tCrA` that MMA's A
        fragment, `tCrB` a tuple (mma_first, mma_acc, B fragment of half 0, of half 1)."""
        c = self.cfg
        cute.arch.setmaxregister_increase(c.reg_split[1])
        mtid = tidx - 128
        thr_mma = tiled_mma.get_slice(mtid)
        fp8 = sA.element_type

        def make_half():
            return sm90_utils.make_trivial_tiled_mma(
                fp8, sB.element_type, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (c.n_mma_wg, 1, 1), (64, c.bn // HALVES),
            )

        first, acc = make_half(), make_half()  # set once here, at the consumers' entry
        first.set(warpgroup.Field.ACCUMULATE, False)
        acc.set(warpgroup.Field.ACCUMULATE, True)
        thr_half = first.get_slice(mtid)
        tCrA = first.make_fragment_A(thr_half.partition_A(sA))
        # sB (bn, 128, stages) -> (bn/2, 128, half, 1, stages): half h is rows [h * bn/2, (h+1) * bn/2)
        sB_h = cute.flat_divide(sB, (c.bn // HALVES, KBLOCK))
        frags = tuple(first.make_fragment_B(thr_half.partition_B(sB_h[(None, None, h, 0, None)]))
                      for h in range(HALVES))
        return mtid, thr_mma, tCrA, (first, acc) + frags

    @cute.jit
    def _issue_half(self, mmas, tmp_h, tCrA, tCrB_h, a_buf, b_buf):
        """One unit: the 4 wgmma (k = 32 each) of a K block's wave into the half temporary, one group."""
        fence_operand(tmp_h)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mmas[0] if k == 0 else mmas[1], tmp_h, tCrA[(None, None, k, a_buf)],
                      tCrB_h[(None, None, k, b_buf)], tmp_h)
        warpgroup.commit_group()

    @cute.jit
    def _promote_half(self, acc, tmp_h, sc, w, h):
        """acc's columns of half h += tmp_h * scale: half h's mn column c is the accumulator's mn column
    h * cols + c (tests/gemm/test_gemm_promote_cpu.py checks the mapping for bn 32 / 64 / 128)."""
        fence_operand(tmp_h)  # after the wgmma wait that completed tmp_h
        acc_mn = mn_view(acc)
        tmp_mn = mn_view(tmp_h)
        cols = cute.size(tmp_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(tmp_mn, mode=[0])):
            for cc in cutlass.range_constexpr(cols):
                acc_mn[r, h * cols + cc] = acc_mn[r, h * cols + cc] + tmp_mn[r, cc] * sc[w, r]

    @cute.jit
    def _block(self, ring, tCrA, frag, accs, tmps, sc, sc_next, sSA, sSW, lrows, kb, g_rd,
               has_next: cutlass.Constexpr):
        """K block kb (its stage waited for, its scales in sc, its first unit issued): for each unit,
        issue the next (the next block's first one when has_next), wait for this one, promote it."""
        c = self.cfg
        S = c.n_stages
        W = c.waves
        U = W * HALVES
        mmas = (frag[0], frag[1])
        st = pipeline.PipelineState(S, g_rd, g_rd % S, (g_rd // S) % 2)
        for j in cutlass.range_constexpr(U):
            w, h = j // HALVES, j % HALVES
            if cutlass.const_expr(j + 1 < U):
                wn, hn = (j + 1) // HALVES, (j + 1) % HALVES
                self._issue_half(mmas, tmps[hn], tCrA, frag[2 + hn], st.index * W + wn, st.index)
                warpgroup.wait_group(1)
            elif cutlass.const_expr(has_next):
                nxt = g_rd + 1
                st_n = pipeline.PipelineState(S, nxt, nxt % S, (nxt // S) % 2)
                ring.consumer_wait(st_n)
                self._read_scales(sc_next, sSA, sSW, lrows, kb + 1, st_n.index)
                self._issue_half(mmas, tmps[0], tCrA, frag[2], st_n.index * W, st_n.index)
                warpgroup.wait_group(1)
            else:
                warpgroup.wait_group(0)
            if cutlass.const_expr(j == U - 1):
                ring.consumer_release(st)
            self._promote_half(accs[w], tmps[h], sc, w, h)
        if cutlass.const_expr(has_next):
            for i in cutlass.range_constexpr(cute.size(sc)):
                sc[i] = sc_next[i]

    @cute.jit
    def _chain(self, ring, tCrA, tCrB, accs, tmps, sc, sc_next, sSA, sSW, lrows, kb, g_rd, n: cutlass.Constexpr):
        """K blocks kb .. kb + n - 1 as one unbroken unit pipeline; all wgmmas done at its end."""
        S = self.cfg.n_stages
        W = self.cfg.waves
        st = pipeline.PipelineState(S, g_rd, g_rd % S, (g_rd // S) % 2)
        ring.consumer_wait(st)
        self._read_scales(sc, sSA, sSW, lrows, kb, st.index)
        self._issue_half((tCrB[0], tCrB[1]), tmps[0], tCrA, tCrB[2], st.index * W, st.index)
        for b in cutlass.range_constexpr(n):
            self._block(ring, tCrA, tCrB, accs, tmps, sc, sc_next, sSA, sSW, lrows, kb + b, g_rd, b + 1 < n)
            g_rd = g_rd + 1
        return g_rd

    @cute.jit
    def _mainloop(self, ring, mmas, tCrA, tCrB, accs, tmp, sSA, sSW, lrows, kb0, kb1, g_rd):
        """The unit pipeline over K blocks kb0 .. kb1 - 1 (module docstring). `mmas` and `tmp` (the
        shipped full-width ones) are unused: tCrB carries the half-width MMAs and B fragments."""
        c = self.cfg
        S = c.n_stages
        W = c.waves
        acc_shape = tCrB[0].get_slice(0).partition_shape_C((c.wave_m, c.bn // HALVES))
        tmps = [cute.make_rmem_tensor(acc_shape, cutlass.Float32) for _ in range(HALVES)]
        sc = cute.make_rmem_tensor(lrows.shape, cutlass.Float32)
        sc_next = cute.make_rmem_tensor(lrows.shape, cutlass.Float32)
        n_kb = cutlass.max(kb1 - kb0, 0)  # a split-K slice past K may be empty
        for i in cutlass.range(n_kb // self.chain, unroll=1):
            g_rd = self._chain(ring, tCrA, tCrB, accs, tmps, sc, sc_next, sSA, sSW, lrows,
                               kb0 + i * self.chain, g_rd, self.chain)
        rest = n_kb % self.chain
        for r in cutlass.range_constexpr(1, self.chain):  # the tail: one chain of r < chain blocks
            if rest == r:
                g_rd = self._chain(ring, tCrA, tCrB, accs, tmps, sc, sc_next, sSA, sSW, lrows,
                                   kb1 - r, g_rd, r)
        return g_rd
