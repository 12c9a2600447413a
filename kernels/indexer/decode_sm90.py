"""SM90 lightning-indexer logits for decode over a paged FP8 cache: DeepGEMM's `fp8_paged_mqa_logits`
contract with one query token per request (next_n = 1):

    logits[b, s] = sum_h w[b, h] * ReLU(q[b, h, :] . k_b[s, :]) * sc_b[s]   for s < len[b]
    logits[b, s] = -inf                                                      for len[b] <= s < W

q FP8 e4m3 [B, 64, 128] (viewed as [B*64, 128]), w fp32 [B, 64], len int32 [B], logits fp32 [B, W]
(any row stride). Request b's key s lives in page table[b, s // 64] at row s % 64. A page is
DeepGEMM's fused block: 64 keys x 128 e4m3 codes (8192 B), then their 64 fp32 scales (256 B), 8448 B
a page (the cache tensor uint8 [pages, 64, 1, 132]). The glue passes two strided views of it: codes
(pages, 64, 128) fp8 and scales (pages, 64) fp32, page stride a multiple of 16 bytes.

The math, the wgmma and the epilogue are the prefill kernel's (IndexerLogitsSm90, whose `kernel`
entry, `_operands`, `_prologue`, `_smem`, `_fragments` and `_tile` this kernel uses; its body is
`_cta`) with one query token per block (bq = 1: wgmma m64 n64 k32, keys on M, the 64 heads on N) and
64-key tiles: one tile = one page. What differs is where the tiles come from and how the work is cut:

  * the key tensor is the codes view with its two row modes merged, ((64, pages), 128): its 64-row
    tile kt is page kt, so one TMA box (and one for the page's scales) loads a whole page, at the
    page id read from the request's block table;
  * CTA (p, b) of a (n_parts, B) grid owns the columns [p * P * 64, (p + 1) * P * 64) of row b
    (P = part_pages, a runtime argument; kernels/indexer/decode_config.py): it scores the pages of
    that range below ceil(len / 64) and writes -inf over the rest of its columns, so every element of
    [B, W] is written exactly once whatever the lengths. CTAs are not persistent: two fit an SM
    (8 stages, ~77 KB of shared memory), and the block scheduler balances ragged lengths;
  * warp 0 issues the TMA loads (the query and weights once, then one page a stage); it reads the
    block table 32 ids at a time (one per lane) and broadcasts them by shuffle; warps 1-3 write the
    -inf columns; one consumer warpgroup runs the wgmma and the epilogue (ReLU x w, head sum, x key
    scale, mask s < len, store).
Lengths are clamped to [0, min(W, 64 * table width)]; a page id outside the cache reads zeros (TMA
bounds), never memory outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.pipeline import pipeline_init_wait

from kernels.indexer.logits_config import HEAD_DIM, LogitsConfig
from kernels.indexer.logits_sm90 import IndexerLogitsSm90

PAGE = 64  # keys per page (DeepGEMM's SM90 block_kv)
PAGE_BYTES = PAGE * (HEAD_DIM + 4)  # 64 keys x (128 codes + one fp32 scale)
FILL_THREADS = 96  # warps 1-3


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time configuration: the KV ring depth (pages in flight per CTA)."""

    stages: int = 8

    def logits(self) -> LogitsConfig:
        """The prefill kernel's configuration this kernel runs its tiles with."""
        return LogitsConfig(bq=1, n_wg=1, stages=self.stages, q_stages=1)


class IndexerDecodeSm90(IndexerLogitsSm90):
    def __init__(self, cfg: DecodeConfig):
        super().__init__(cfg.logits())

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (B*64, 128) fp8 e4m3: q[b, h, :] at row b*64 + h
        mCodes: cute.Tensor,  # (pages, 64, 128) fp8 e4m3: the cache's codes
        mScales: cute.Tensor,  # (pages, 64) fp32: the cache's key scales
        mW: cute.Tensor,  # (B, 64) fp32 head weights
        mLens: cute.Tensor,  # (B,) int32 valid keys of each request
        mTable: cute.Tensor,  # (B, max_blocks) int32 page ids
        mL: cute.Tensor,  # (B, W) fp32 logits
        part_pages: cutlass.Int32,  # pages per CTA (P)
        n_parts: cutlass.Int32,  # CTAs per request: n_parts * P * 64 >= W
        stream: cuda.CUstream,
    ):
        ops = self._paged_operands(mQ, mCodes, mScales, mW)
        self.kernel(*ops[:8], mLens, mTable, mL, part_pages, *ops[8:]).launch(
            grid=(n_parts, cute.size(mL, mode=[0]), 1), block=[self.cfg.threads, 1, 1], min_blocks_per_mp=2,
            preferred_smem_carveout=100, stream=stream)

    def _paged_operands(self, mQ, mCodes, mScales, mW):
        """`_operands` over the cache's two views with their page and key modes merged,
        ((64 keys, pages), 128) and ((64 keys, pages),): key tile kt of 64 rows is page kt."""
        mK = cute.make_tensor(mCodes.iterator, cute.group_modes(cute.select(mCodes.layout, mode=[1, 0, 2]), 0, 2))
        mSc = cute.make_tensor(mScales.iterator, cute.group_modes(cute.select(mScales.layout, mode=[1, 0]), 0, 2))
        return self._operands(mQ, mK, mSc, mW)

    @cute.jit
    def _cta(self, tma, mLens, mTable, mL, part_pages, mmas, layouts, Storage):
        """The body of the kernel (IndexerLogitsSm90.kernel, the entry both share): CTA (p, b) of the
        (n_parts, B) grid (module docstring)."""
        part, b, _ = cute.arch.block_idx()
        n_len = clamped_len(mLens, mTable, b, cute.size(mL, mode=[1]))
        self._run_pages(tma, mTable, mL, part_pages, mmas, layouts, Storage, n_len, None, mL, cute.size(mL, mode=[1]))

    @cute.jit
    def _run_pages(self, tma, mTable, mFill, part_pages, mmas, layouts, Storage, n_len, fp, dst, fill_to):
        """The roles of CTA (p, b) over its request's first n_len keys: warp 0 loads the pages of the
        part (the table column of page i: `_table_col(i, fp)`), warps 1-3 write -inf over mFill's row
        past them up to column fill_to (mFill None: nothing), the consumer warpgroup scores them into
        `dst` (`_page_plan`)."""
        (tma_k, _), (tma_q, _), (tma_sc, _), (tma_w, _) = tma
        tiled_mma, mma_acc = mmas
        tidx, _, _ = cute.arch.thread_idx()
        part, b, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        self._prologue(warp_idx, mmas, tma)
        kv_ring, q_ring, sK, sQ, sSc, sW, tKs, tKg, tQs, tQg, tScs, tScg, tWs, tWg, st = self._smem(Storage, layouts,
                                                                                                     tma)
        pg0 = part * part_pages
        pg1 = cutlass.min(pg0 + part_pages, (n_len + PAGE - 1) // PAGE)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if warp_idx == 0:
            if pg1 > pg0:
                self._produce(kv_ring, q_ring, tma_k, tKg, tKs, tma_sc, tScg, tScs, tma_q, tQg, tQs, tma_w, tWg, tWs,
                              mTable, b, pg0, pg1, fp, tidx % 32)
            n = cutlass.max(pg1 - pg0, 0)  # pages loaded, and the one query load if any
            nq = cutlass.min(n, 1)
            S = self.cfg.n_stages
            kv_ring.producer_tail(pipeline.PipelineState(S, n, n % S, ((n // S) % 2) ^ 1))
            q_ring.producer_tail(pipeline.PipelineState(1, nq, 0, nq ^ 1))
        elif warp_idx < 4:
            if cutlass.const_expr(mFill is not None):
                # -inf over the part's columns at or past the last page: [max(lo, 64 * pages), hi)
                width = cute.size(mFill, mode=[1])
                hi = cutlass.min((part + 1) * part_pages * PAGE, cutlass.min(width, fill_to))
                a = cutlass.max(cutlass.min(pg0 * PAGE, width), cutlass.min((n_len + PAGE - 1) // PAGE * PAGE, width))
                ninf = -cutlass.Float32.inf
                for s in cutlass.range(a + tidx - 32, hi, FILL_THREADS, unroll=1):
                    mFill[b, s] = ninf
        else:
            if pg1 > pg0:
                self._consume_pages(kv_ring, q_ring, tiled_mma, mma_acc, sK, sQ, sSc, sW, st, dst, b, n_len, pg0, pg1,
                                    tidx)

    def _table_col(self, i, fp):
        """The block-table column of the request's page i (the decode kernel: page i itself)."""
        return i

    @cute.jit
    def _produce(self, kv_ring, q_ring, tma_k, tKg, tKs, tma_sc, tScg, tScs, tma_q, tQg, tQs, tma_w, tWg, tWs,
                 mTable, b, pg0, pg1, fp, lane):
        """Warp 0: request b's query and weights, then pages pg0 .. pg1-1 of its block table, one a
        stage. The page ids come 32 at a time (lane i loads entry i), loaded before the stage's
        acquire so that the load overlaps the wait, and reach the warp by shuffle."""
        S = self.cfg.n_stages
        qst = pipeline.PipelineState(1, 0, 0, 1)
        q_ring.producer_acquire(qst)
        qbar = q_ring.producer_get_barrier(qst)
        cute.copy(tma_q, tQg[(None, b, 0)], tQs[(None, 0)], tma_bar_ptr=qbar)
        cute.copy(tma_w, tWg[(None, b, 0)], tWs[(None, 0)], tma_bar_ptr=qbar)
        q_ring.producer_commit(qst)
        ids = cutlass.Int32(0)
        for pg in cutlass.range(pg0, pg1, unroll=1):
            i = pg - pg0
            if i % 32 == 0:
                ids = cutlass.Int32(0)
                if pg + lane < pg1:
                    ids = mTable[b, self._table_col(pg + lane, fp)]
            kst = pipeline.PipelineState(S, i, i % S, ((i // S) % 2) ^ 1)
            kv_ring.producer_acquire(kst)
            page = cute.arch.shuffle_sync(ids, i % 32)
            bar = kv_ring.producer_get_barrier(kst)
            cute.copy(tma_k, tKg[(None, page, 0)], tKs[(None, kst.index)], tma_bar_ptr=bar)
            cute.copy(tma_sc, tScg[(None, page)], tScs[(None, kst.index)], tma_bar_ptr=bar)
            kv_ring.producer_commit(kst)

    @cute.jit
    def _consume_pages(self, kv_ring, q_ring, tiled_mma, mma_acc, sK, sQ, sSc, sW, st, dst, b, n_len, pg0, pg1, tidx):
        """The consumer warpgroup: the weights into registers, then the prefill kernel's tile step
        (wgmma, ReLU x w, head sum, x scale, then `_epilogue` with the plan of `_page_plan`) on each
        page, page pg at columns 64 pg .. 64 pg + 63 of row b."""
        tCrA, tCrB, acc, rows, heads = self._fragments(tiled_mma, sK, sQ, tidx - 128)
        wreg = cute.make_rmem_tensor((cute.size(heads),), cutlass.Float32)
        sc = cute.make_rmem_tensor((1,), cutlass.Float32)
        qst = pipeline.PipelineState(1, 0, 0, 0)
        q_ring.consumer_wait(qst)
        for cc in cutlass.range_constexpr(cute.size(heads)):
            wreg[cc] = sW[0, heads[cc], 0]
        q4 = tidx % 4
        plan = self._page_plan(dst, st, b, n_len, rows, q4, tidx)
        kst = self._kv_state(cutlass.Int32(0))
        for pg in cutlass.range(pg0, pg1, unroll=1):
            self._tile(kv_ring, (tiled_mma, mma_acc), acc, tCrA, tCrB, 0, sSc, sc, kst, pg, wreg, plan, q4, 0)
            kst = self._step(kst, 1)
        q_ring.consumer_release(qst)
        self._pages_done(plan, tidx)

    @cute.jit
    def _page_plan(self, mL, st, b, n_len, rows, q4, tidx):
        """The epilogue's plan (LogitsEpilogue._lane_plan): row b of mL, keys [0, n_len)."""
        tok = cute.make_rmem_tensor((1,), cutlass.Int32)
        tks = cute.make_rmem_tensor((1,), cutlass.Int32)
        tke = cute.make_rmem_tensor((1,), cutlass.Int32)
        tok[0] = b
        tks[0] = 0
        tke[0] = n_len
        return self._lane_plan(mL, tok, tks, tke, rows, q4, cute.size(mL, mode=[0]), cute.size(mL, mode=[1]))

    def _pages_done(self, plan, tidx):
        """After the part's last page (the decode kernel: nothing left)."""


@cute.jit
def clamped_len(mLens, mTable, b, width):
    """Request b's key count as every decode kernel reads it: its length clamped to
    [0, min(W, 64 * table width)]."""
    return cutlass.min(cutlass.max(mLens[b], 0), cutlass.min(width, cute.size(mTable, mode=[1]) * PAGE))
