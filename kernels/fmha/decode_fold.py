"""FP8 sparse decode v4 candidate (issue #25): the fixed cost at few requests. `cutedsl:fused-pk-fold` is
the default decode (decode_prefetch.FusedPackedLoop, `fused-pk-loop`) with two changes, both in this
class's own methods (the shipped kernels are not touched: their cubins hash the same):

(a) The combine folded into the kernel. Each split CTA writes its partial O and LSE as before (the
    epilogue, unchanged); then every consumer thread fences its stores (fence.acq_rel.gpu), the 256
    consumers meet at a named barrier, and one thread counts the CTA in with atom.add.acq_rel.gpu on a
    per-(request, head block) counter of a workspace (zeroed by the glue once when allocated; the last
    CTA stores 0 back, so the next call finds zeros): the pattern of the gemm family's split-K fix-up
    (kernels/gemm/persistent_sm90.py `_split_k_merge`). The CTA that arrives last fences again and
    merges every split's partials of its 64 heads into the final O and LSE with decode_combine.py's
    math in the same order of operations (max over the splits in order; w_s = exp2((lse_s - m) log2 e),
    the sum and the weighted O accumulated in split order, skipping w_s = 0; O x 1 / (sum + e^(sink - m))),
    so its output is bit-for-bit the combine kernel's: no second launch. One split: the epilogue writes
    the final O and LSE with the sink (as today) and the counter is not touched.
    Layout of the merge: the splits' LSEs of the 64 heads go to smem (the K stages' region, free once
    every consumer is past its epilogue), 64 threads turn them into the weights w[h, s] and 1 / den[h]
    (and the final LSE), then each of the 256 consumer threads owns 16 16-byte chunks of the 64 x 512
    output, in two passes of 8 chunks (64 fp32 accumulators), reading two splits an iteration (16 loads
    of 16 bytes in flight a thread: 64 KB a CTA). The weights' 1 / den is rcp.rn's fast path written
    out (`rcp_rn_fast`), and the variant runs at setmaxnreg (80, 216) (`FOLD_REGS`): at fused-pk-loop's
    (88, 208) the fold spilled 16-24 B of the consumers' epilogue values (docs/lessons/fmha.md 38).
(b) Q after the first slot tokens. The producer issues pair 0's slot-token cp.async and commits it as
    its own group before Q's 32 cp.async a thread (64 KB a CTA, their own group, tracked by q_full as
    before); pair 0 waits with cp.async.wait_group 1 (its slot tokens only), so the first rows' packing
    and loads no longer wait for Q's bytes (before, pair 0's wait_group 0 covered the Q copies too).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import torch

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.runtime import make_fake_tensor
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.common import Prepared, compile_kernel
from kernels.fmha.barriers import NamedBarrier
from kernels.fmha.config import LN2, LOG2E
from kernels.fmha.decode_fused import ROWS_PER_BATCH
from kernels.fmha.decode_fused import fake_args as fused_fake_args
from kernels.fmha.decode_glue import (D, PACKED_MAX_BLOCK, PACKED_MAX_BLOCKS, CompiledDecode, attention_config,
                                      full_lengths, fused_slots, plan)
from kernels.fmha.decode_prefetch import PACK_BITS, FusedPackedLoop
from kernels.regs import pin
from kernels.trace import record
from oracles.fmha_cache import cache_views

# setmaxnreg (producer, consumers): at fused-pk-loop's (88, 208) the fold's code spilled 16 B of the
# consumers' epilogue values (ptxas, whichever warpgroup ran the weights); 3 x 128 x ... = 128 x (80 + 2 x 216) = 64K
FOLD_REGS = (80, 216)
CHUNKS = 16  # 16-byte chunks of the 64 x 512 bf16 output a thread: 64 heads x 64 chunks / 256 threads
PASS_CHUNKS = 8  # chunks a pass (64 fp32 accumulators)
SPLITS_PER_ITER = 2  # splits whose chunks are loaded together (16 x 16 bytes in flight a thread)


@dsl_user_op
def sreg(name: str, *, loc=None, ip=None) -> Int32:
    """A special register (`%tid.x`, `%ctaid.y`, ...) read by a volatile mov where the fold needs it: not
    merged with the kernel's first read, so the fold keeps nothing live across the consumers' loop."""
    return Int32(llvm.inline_asm(T.i32(), [], f"mov.u32 $0, %{name};", "=r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def rcp_rn_fast(x, *, loc=None, ip=None) -> Float32:
    """1 / x as ptxas's rcp.rn.f32 fast path computes it (MUFU.RCP, then one Newton step: t = -(x r - 1),
    r + r t; read off the SASS of the combine's `1.0 / den`): the same correctly rounded value for every x
    in [2^-126, 2^126), where rcp.rn never leaves that path. Written out because rcp.rn's range check
    branches to a slow-path subroutine, and a third call site in the kernel spilled 16-24 B of the
    consumers' registers at 208. The fold's den is >= 1 (the largest split's weight is 1); x >= 2^126
    gives 0 here (`_fold_weights`), a denormal there."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
        "{\n.reg .f32 r, t;\nrcp.approx.ftz.f32 r, $1;\nfma.rn.f32 t, $1, r, 0fBF800000;\nneg.ftz.f32 t, t;\n"
        "fma.rn.f32 $0, r, t, r;\n}",
        "=f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def max_fold_splits(h_block: int = 64) -> int:
    """Splits whose LSEs fit the K stages' smem (2 stages x 64 keys x 512 bf16 = 128 KB) as fp32 per head."""
    return 2 * 64 * D * 2 // (4 * h_block)


class FusedPackedFold(FusedPackedLoop):
    """fused-pk-loop + the combine folded into the last CTA of a (request, head block) + Q's cp.async
    after pair 0's slot tokens (module docstring)."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (rows, h_q, d, B) bf16, rows of one request = its splits (stride 0)
        codes0: cute.Tensor, rope0: cute.Tensor, sc0: cute.Tensor, idx0: cute.Tensor, len0: cute.Tensor,
        codes1: cute.Tensor, rope1: cute.Tensor, sc1: cute.Tensor, idx1: cute.Tensor, len1: cute.Tensor,
        mLen: cute.Tensor,  # (rows, B) int32: the chunk (slots per row)
        mSink: cute.Tensor,  # (h_q,) fp32: the epilogue's sink (-inf when split, the sink with one split)
        mO: cute.Tensor,  # (rows, h_q, dv, B) bf16: partial O when split, else the output
        mLse: cute.Tensor,  # (rows, h_q, B) fp32
        mSinkF: cute.Tensor,  # (h_q,) fp32: the sink of the fold
        mOut: cute.Tensor,  # (B, h_q, dv) bf16: the fold's output (split only)
        mLseOut: cute.Tensor,  # (B, h_q) fp32
        mCount: cute.Tensor,  # (B * n_hblk,) int32 arrival counters, zero between calls
        scale_log2: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        c = self.cfg
        dt = mQ.element_type
        n = c.n_block
        qk_mma, pv_mma, pv_ss_mma = self.tiled_mmas(dt)
        sQ_layout, sK_layout, _, sP_layout = self.smem_layouts(dt)
        record("config", f"fused FP8 decode + folded combine {c} n_block={n} threads={c.threads} "
               f"rows/batch={self.rows_per_batch} setmaxnreg={self.fused_regs}")
        n_bars = 4 * c.stages + 2

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, n_bars]
            sIdx: cute.struct.MemRange[cutlass.Int32, c.stages * n]
            sMaskFlag: cute.struct.MemRange[cutlass.Int32, c.stages * 4]
            sRows: cute.struct.MemRange[cutlass.Int32, n * 2 * c.stages]
            sFold: cute.struct.MemRange[cutlass.Int32, 4]  # [0]: this CTA arrived last
            sX: cute.struct.MemRange[cutlass.Float32, c.xchg_floats(n)]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sP_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        grid = (cute.size(mLen, mode=[0]), c.n_hblk, cute.size(mQ, mode=[3]))
        self.kernel(
            mQ, codes0, rope0, sc0, idx0, len0, codes1, rope1, sc1, idx1, len1, mLen, mSink, mO, mLse, mSinkF, mOut,
            mLseOut, mCount, scale_log2, qk_mma, pv_mma, pv_ss_mma, sQ_layout, sK_layout, sP_layout, Storage,
        ).launch(grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        codes0: cute.Tensor, rope0: cute.Tensor, sc0: cute.Tensor, idx0: cute.Tensor, len0: cute.Tensor,
        codes1: cute.Tensor, rope1: cute.Tensor, sc1: cute.Tensor, idx1: cute.Tensor, len1: cute.Tensor,
        mLen: cute.Tensor,
        mSink: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        mSinkF: cute.Tensor,
        mOut: cute.Tensor,
        mLseOut: cute.Tensor,
        mCount: cute.Tensor,
        scale_log2: cutlass.Float32,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        pv_ss_mma: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
    ):
        c = self.cfg
        S = c.stages
        n = c.n_block
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        s_q = cute.size(mQ, mode=[0])

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        bars = st.bars.data_ptr()
        q_full, q_empty = bars + 4 * S, bars + 4 * S + 1
        sIdx = st.sIdx.get_tensor(cute.make_layout((n, S)))
        sMaskFlag = st.sMaskFlag.get_tensor(cute.make_layout((4, S)))
        sRows = st.sRows.get_tensor(cute.make_layout((n, 2, S)))
        sFold = st.sFold.get_tensor(cute.make_layout((4,)))
        sX = st.sX.get_tensor(cute.make_layout((c.xchg_floats(n),)))
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)[None, None, 0]
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sVt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        self._init_barriers(tidx, bars, (64,) * (2 * S) + (128,) * (2 * S), q_full, q_empty)

        if wg == c.n_consumer_wg:
            cute.arch.setmaxregister_decrease(self.fused_regs[0])
            ptid = tidx - 128 * c.n_consumer_wg
            atom = self.row_copy_atom(mQ.element_type)
            blk, bidx, kvh, head0, n_idx, n_tiles, tok0 = self._item(Int32(0), mLen, mLen, mQ, mLen)
            caches = (codes0, rope0, sc0, idx0, len0, codes1, rope1, sc1, idx1, len1)
            stage = ptid // n
            lt = ptid - stage * n
            # (b) pair 0's slot tokens first, in their own cp.async group; then Q in another
            self._copy_slot(caches, sRows[None, 0, stage], bidx, blk * n_idx + stage * n + lt, lt)
            cute.arch.cp_async_commit_group()
            self._copy_q(atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx)
            cute.arch.cp_async_mbarrier_arrive_noinc(q_full)
            cute.arch.cp_async_commit_group()
            if ptid < n:
                self._produce_fp8_tiles(caches, sK, sRows[None, None, 0], sIdx, sMaskFlag, bars, ptid, blk, bidx,
                                        n_idx, n_tiles, 0)
            else:
                self._produce_fp8_tiles(caches, sK, sRows[None, None, 1], sIdx, sMaskFlag, bars, ptid - n,
                                        blk, bidx, n_idx, n_tiles, 1)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            if cute.size(mLen, mode=[0]) > 1:
                self._fold_count(mLse, mSinkF, mLseOut, mCount, sFold, sX, st.sK.data_ptr())
        else:
            cute.arch.setmaxregister_increase(self.fused_regs[1])
            self._consume(
                mQ, mLen, mLen, mLen, mO, mLse, mSink, scale_log2, Int32(0), Int32(1 << 30), qk_mma, pv_mma,
                pv_ss_mma, sQ, sK, sVt, sIdx, sMaskFlag, sX, st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner),
                bars, wg, tidx % 128,
            )
            if cute.size(mLen, mode=[0]) > 1:
                self._fold_merge(mO, mOut, sFold, sX, st.sK.data_ptr())

    # ------------------------------------------------------------------ (b) the producer's loop
    @cute.jit
    def _produce_fp8_tiles(self, caches, sK, sRows, sIdx, sMaskFlag, bars, lt, blk, bidx, n_idx, n_tiles,
                           stage: cutlass.Constexpr):
        """decode_prefetch.FusedPrefetchLoop's loop (packed slots) without its first slot copy (the kernel
        issued it before Q) and with pair 0 waiting only for its slot tokens (wait_group 1: Q's group,
        committed after them, may still be in flight)."""
        n = self.cfg.n_block
        base = blk * n_idx
        n_pairs = (n_tiles + 1) // 2
        for pair in cutlass.range(n_pairs, unroll=1):
            buf = pair & 1
            j0 = base + (2 * pair + stage) * n
            if pair == 0:
                cute.arch.cp_async_wait_group(1)
            else:
                cute.arch.cp_async_wait_group(0)
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._copy_slot(caches, sRows[None, 1 - buf], bidx, j0 + 2 * n + lt, lt)
            cute.arch.cp_async_commit_group()
            t = pin(lt)
            mine = self._valid_token(caches, bidx, j0 + t, sRows[t, buf])
            k0p = self._k0_padded(caches[3])
            if pair == 0:
                self._prefetch_row(caches, j0 >= k0p, mine)
            cache = self._select_cache(caches, j0 >= k0p)
            bs = cute.size(cache[0], mode=[1])
            mm = cutlass.max(mine, 0)
            blk_m = mm // bs
            packed = (blk_m << PACK_BITS) | (mm - blk_m * bs)
            sRows[t, buf] = cutlass.select_(mine >= 0, packed, Int32(-1))
            cute.arch.barrier(barrier_id=NamedBarrier.ROWS0 + stage, number_of_threads=64)
            self._dequant_tile(cache, caches, sK[None, None, stage], sRows[None, buf], sIdx, sMaskFlag, mine,
                               bidx, j0, t, bars, (pair & 1) ^ 1, stage)
            if pair + 1 < n_pairs:
                cute.arch.cp_async_wait_group(0)
                j1 = j0 + 2 * n
                nxt = self._valid_token(caches, bidx, j1 + t, sRows[t, 1 - buf])
                self._prefetch_row(caches, j1 >= self._k0_padded(caches[3]), nxt)

    # ------------------------------------------------------------------ (a) the folded combine
    @cute.jit
    def _fold_count(self, mLse, mSinkF, mLseOut, mCount, sFold, sX, k_ptr):
        """The producer warpgroup of a split CTA, once its loop is done: wait until every consumer has
        fenced its partial O / LSE stores (bar.sync 0, the whole CTA), count the CTA in (one thread,
        atom.add.acq_rel.gpu); the last CTA of its (request, head block) reads the splits' LSEs and turns
        them into the weights (`_fold_weights`); then release the consumers (bar.sync 0 again). The
        producer's 128 threads are idle by then; the consumers' merge waits for the weights anyway."""
        c = self.cfg
        ptid = sreg("tid.x") - 128 * c.n_consumer_wg
        hblk, bidx = sreg("ctaid.y"), sreg("ctaid.z")
        n_split = cute.size(mLse, mode=[0])
        cute.arch.barrier()  # every consumer's partial stores are fenced (`_fold_merge`)
        if ptid == 0:
            slot = bidx * c.n_hblk + hblk
            old = cute.arch.atomic_add(mCount.iterator + slot, Int32(1), sem="acq_rel", scope="gpu")
            last = old == n_split - 1
            sFold[0] = cutlass.select_(last, Int32(1), Int32(0))
            if last:
                mCount[slot] = Int32(0)  # for the next call (the kernel boundary orders it)
        cute.arch.barrier(barrier_id=NamedBarrier.PRODUCER, number_of_threads=128)
        if sFold[0] != 0:
            cute.arch.fence_acq_rel_gpu()  # every other split's stores, released by its count, are seen
            sW = cute.make_tensor(cute.recast_ptr(k_ptr, dtype=Float32), cute.make_layout((64, n_split)))
            self._fold_weights(mLse, mSinkF, mLseOut, sW, sX, n_split, hblk * 64, bidx, ptid)
        cute.arch.barrier()  # the consumers may merge

    @cute.jit
    def _fold_merge(self, mO, mOut, sFold, sX, k_ptr):
        """The consumers of a split CTA after the epilogue: fence the partial stores, meet the producer
        warpgroup (`_fold_count`) twice; in the last CTA, merge the splits' O (`_fold_outputs`)."""
        tidx, hblk, bidx = sreg("tid.x"), sreg("ctaid.y"), sreg("ctaid.z")
        n_split = cute.size(mO, mode=[0])
        cute.arch.fence_acq_rel_gpu()  # this thread's partial O / LSE stores before the count
        cute.arch.barrier()
        cute.arch.barrier()  # counted; in the last CTA the weights are in smem
        if sFold[0] != 0:
            cute.arch.fence_acq_rel_gpu()
            sW = cute.make_tensor(cute.recast_ptr(k_ptr, dtype=Float32), cute.make_layout((64, n_split)))
            self._fold_outputs(mO, mOut, sW, sX, n_split, hblk * 64, bidx, tidx)

    @cute.jit
    def _fold_weights(self, mLse, mSinkF, mLseOut, sW, sX, n_split, head0, bidx, ptid):
        """sW[h, s] = the splits' LSEs (the producer warpgroup's 128 threads' loads at once), then, by
        thread h < 64: decode_combine's m, w_s (in sW), sum, 1 / den (in sX[h]) and the final LSE of head
        head0 + h."""
        n_lse = 64 * n_split
        for i in cutlass.range((n_lse + 127) // 128, unroll=1):
            k = i * 128 + ptid
            if k < n_lse:
                s = k // 64
                sW[k - s * 64, s] = mLse[s, head0 + k - s * 64, bidx]
        cute.arch.barrier(barrier_id=NamedBarrier.PRODUCER, number_of_threads=128)
        if ptid < 64:
            h = ptid
            m = -Float32.inf
            for s in cutlass.range(n_split, unroll=1):
                m = cute.arch.fmax(m, sW[h, s])
            tot = Float32(0.0)
            if m > -Float32.inf:
                for s in cutlass.range(n_split, unroll=1):
                    w = cute.arch.exp2((sW[h, s] - m) * LOG2E)
                    tot = tot + w
                    sW[h, s] = w
            else:
                for s in cutlass.range(n_split, unroll=1):
                    sW[h, s] = Float32(0.0)
            inv = Float32(0.0)  # no valid key: O = 0
            if tot > Float32(0.0):
                den = tot + cute.arch.exp2((mSinkF[head0 + h] - m) * LOG2E)
                inv = cutlass.select_(den < Float32(2.0 ** 126), rcp_rn_fast(den), Float32(0.0))
            sX[h] = inv
            lse = -Float32.inf
            if tot > Float32(0.0):
                lse = m + cute.math.log2(tot, fastmath=False) * LN2
            mLseOut[bidx, head0 + h] = lse

    @cute.jit
    def _fold_outputs(self, mO, mOut, sW, sX, n_split, head0, bidx, tidx):
        """Thread tidx's chunks k * 256 + tidx of the 64 x 512 output (head 4 k + tidx // 64, 16-byte chunk
        tidx % 64), in passes of PASS_CHUNKS: acc += w_s O_s in split order (w_s = 0 skipped), two splits'
        loads in flight together; then O = acc x 1 / den as bf16."""
        col = tidx % 64
        for p in cutlass.range_constexpr(CHUNKS // PASS_CHUNKS):
            acc = cute.make_rmem_tensor((8, PASS_CHUNKS), Float32)
            acc.fill(0.0)
            for s0 in cutlass.range(0, n_split, SPLITS_PER_ITER, unroll=1):
                vals = cute.make_rmem_tensor((8, PASS_CHUNKS, SPLITS_PER_ITER), BFloat16)
                for u in cutlass.range_constexpr(SPLITS_PER_ITER):
                    s = cutlass.min(s0 + u, n_split - 1)  # past the last split: a repeated load, weight 0
                    for k in cutlass.range_constexpr(PASS_CHUNKS):
                        h = 4 * (p * PASS_CHUNKS + k) + tidx // 64
                        cute.autovec_copy(cute.local_tile(mO[s, head0 + h, None, bidx], (8,), (col,)),
                                          vals[None, k, u])
                for u in cutlass.range_constexpr(SPLITS_PER_ITER):
                    s = cutlass.min(s0 + u, n_split - 1)
                    for k in cutlass.range_constexpr(PASS_CHUNKS):
                        h = 4 * (p * PASS_CHUNKS + k) + tidx // 64
                        w = sW[h, s]
                        # a split with no valid key adds nothing (the combine skips its O), nor does the
                        # repeated load past the last split
                        ok = (s0 + u < n_split) & (w > Float32(0.0))
                        for e in cutlass.range_constexpr(8):
                            acc[e, k] = cutlass.select_(ok, acc[e, k] + w * vals[e, k, u].to(Float32), acc[e, k])
            out = cute.make_rmem_tensor((8,), BFloat16)
            for k in cutlass.range_constexpr(PASS_CHUNKS):
                h = 4 * (p * PASS_CHUNKS + k) + tidx // 64
                inv = sX[h]
                for e in cutlass.range_constexpr(8):
                    out[e] = (acc[e, k] * inv).to(BFloat16)
                cute.autovec_copy(out, cute.local_tile(mOut[bidx, head0 + h, None], (8,), (col,)))


def fake_args() -> tuple:
    """decode_fused.fake_args + the fold's sink (h,), output (b, h, 512), LSE (b, h) and counters (n,)."""
    *head, scale = fused_fake_args()
    b, h = cute.sym_int32(), cute.sym_int32()

    def s64(div=1):
        return cute.sym_int64(divisibility=div)

    sink = make_fake_tensor(Float32, (h,), (1,), assumed_align=4)
    out = make_fake_tensor(BFloat16, (b, h, 512), (s64(8), s64(8), 1), assumed_align=16)
    lse = make_fake_tensor(Float32, (b, h), (s64(), 1), assumed_align=4)
    count = make_fake_tensor(Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    return (*head, sink, out, lse, count, scale)


def compile_fold(h_q: int, arch: str) -> CompiledDecode:
    """The fold kernel alone (no combine launch), compiled with fake tensors (no GPU needed)."""
    kernel = FusedPackedFold(attention_config(h_q), ROWS_PER_BATCH, FOLD_REGS, True, True)
    compiled = CompiledDecode({"fused": compile_kernel(kernel, *fake_args(), arch=arch)})
    compiled.packed_slots = True
    return compiled


class FoldWorkspace:
    """decode_glue.FusedWorkspace's buffers (partial O, partial LSE, per-row lengths, no-sink) + the
    arrival counters, one int32 a (request, head block), zeroed once when allocated (the kernel's last
    CTA of each stores 0 back); reused while the shape is the same."""

    def __init__(self):
        self.key, self.bufs = None, None
        self.views = Prepared(size=2)

    def get(self, b: int, h_q: int, n_split: int, chunk: int, device) -> tuple:
        key = (b, h_q, n_split, chunk, torch.device(device))
        if self.key != key:
            self.bufs = (
                torch.empty(b, n_split, h_q, D, dtype=torch.bfloat16, device=device),
                torch.empty(b, n_split, h_q, dtype=torch.float32, device=device),
                torch.full((b, n_split), chunk, dtype=torch.int32, device=device).t(),
                torch.full((h_q,), float("-inf"), device=device),
                torch.zeros(b * (h_q // 64), dtype=torch.int32, device=device),
            )
            self.key = key
        return self.bufs


def run_fold(compiled: CompiledDecode, ws: FoldWorkspace, q, caches, indices, lens, sink, out, lse, sms: int,
             split: tuple | None = None) -> None:
    """As decode_glue.run_fused (same plan, so an A/B compares like with like), in one launch: the last
    CTA of each (request, head block) merges the splits."""
    fused = compiled.kernels["fused"]
    for i, c in enumerate(caches):
        if c.shape[1] > PACKED_MAX_BLOCK or c.shape[0] >= PACKED_MAX_BLOCKS:
            raise ValueError(f"cache{i}: the packed-slot decode holds block << 10 | token in an int32: blocks of "
                             f"<= {PACKED_MAX_BLOCK} tokens and < {PACKED_MAX_BLOCKS} blocks, got {tuple(c.shape[:2])}")
    b, h_q, _ = q.shape
    n_split, chunk = split or plan(b, h_q, fused_slots(indices[0].shape[1], indices[1].shape[1]), sms)
    if n_split > max_fold_splits():
        raise ValueError(f"the folded combine keeps the splits' LSEs in smem: at most {max_fold_splits()} splits, "
                         f"got {n_split}")
    o_part, l_part, row_lens, no_sink, count = ws.get(b, h_q, n_split, chunk, q.device)
    args = []
    for cache, idx, ln in zip(caches, indices, lens):
        args += [*ws.views.get((cache,), lambda c=cache: cache_views(c)), idx, full_lengths(idx) if ln is None else ln]
    is_split = n_split > 1
    o_dst = o_part if is_split else out[:, None]
    l_dst = l_part if is_split else lse[:, None]
    fused(q[:, None].expand(b, n_split, h_q, D).permute(1, 2, 3, 0), *args, row_lens,
          no_sink if is_split else sink, o_dst.permute(1, 2, 3, 0), l_dst.permute(1, 2, 0), sink, out, lse, count,
          D ** -0.5 * LOG2E)
