"""Gathered-key attention for Hopper (SM90) in CuTeDSL: head_dim up to 512, sink, masks, LSE.

Each CTA owns a block of query rows and walks a list of key indices `idx[block, :len[block]]`
(-1 = invalid) in tiles of `n_block` keys: DSV4 sparse attention (per-token top-k + window
lists) and dense causal / window attention (each block's key range plus a positional mask) are
the same kernel. One producer warpgroup fills the smem stages; consumer warpgroups run one of
three schedules. Design and version history: docs/perf/fmha.md.

The kernel class is assembled from one mixin per job:
  config.py     Config: what changes the compiled code (tiles, smem, registers)
  barriers.py   named barriers and the mbarrier layout
  scheduler.py  TileScheduler: the CTA's work items (persistent snake order)
  producer.py   Producer: Q, then K/V tiles by TMA or cp.async gather
  consumer.py   Consumer: fragments, per-item loop, schedule dispatch
  pingpong.py   PingPong: d <= 256, two warpgroups taking turns
  split_d.py    SplitD: dv = 512, V != K, S split along d
  key_split.py  KeySplit: dv = 512, V = K, alternate key tiles
  softmax.py    Softmax: mask, online softmax, row reductions
  mma.py        Mma: wgmma issue, K/V stage waits and releases, fragment views
  epilogue.py   Epilogue: normalise O, store O and LSE
  variants.py   knock-out subclasses (timed, never compared) and the declared candidate forms
  prefill_v11.py  v11, the default sparse prefill (Q by TMA, O by TMA store, hinted gather), and its A/B forms
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from kernels.fmha.config import Config
from kernels.fmha.consumer import Consumer
from kernels.fmha.epilogue import Epilogue
from kernels.fmha.key_split import KeySplit
from kernels.fmha.mma import Mma
from kernels.fmha.pingpong import PingPong
from kernels.fmha.producer import Producer
from kernels.fmha.scheduler import TileScheduler
from kernels.fmha.softmax import Softmax
from kernels.fmha.split_d import SplitD
from kernels.trace import record


class GatherAttentionSm90(Consumer, PingPong, SplitD, KeySplit, Softmax, Mma, Producer, TileScheduler, Epilogue):
    """The kernel for one Config: `__call__` builds the MMAs, smem layouts, TMA atoms and launches
    `kernel`, which splits the CTA into the producer and the consumers."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def _mbar_wait(self, bar, phase):
        """The key split's stage waits (the consumers' full, the producer's empty): the library's
        wait, whose try_wait carries a 10 ms suspend hint (NANOSLEEP.SYNCS in the SASS); a seam for
        prefill_v11.SpinWait."""
        cute.arch.mbarrier_wait(bar, phase)

    def tiled_mmas(self, dt):
        """Per warpgroup: S = Q K^T; O += P V with P from registers; and O += P V with the key split
        partner's P (64 x n, one per tile of the pair) as the shared-memory A operand."""
        c = self.cfg

        def mma(b_major, n, *source):
            return sm90_utils.make_trivial_tiled_mma(dt, dt, warpgroup.OperandMajorMode.K, b_major,
                                                     cutlass.Float32, (1, 1, 1), (64, n), *source)

        return (mma(warpgroup.OperandMajorMode.K, c.n_block),
                mma(warpgroup.OperandMajorMode.MN, c.dv_wg, warpgroup.OperandSource.RMEM),
                mma(warpgroup.OperandMajorMode.MN, c.dv_wg))

    def smem_layouts(self, dt):
        """The swizzled shared-memory layouts: Q (rows, d) and the K stages (keys, d, stage), K-major;
        the V^T stages (dv, keys, stage), MN-major; the key split's P of each tile of the pair (rows,
        keys, tile), K-major."""
        c = self.cfg
        n = c.n_block
        return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (c.m_cta, n, c.d), dt, 1),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (64, n, c.d), dt, c.stages),
                sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (64, c.dv, n), dt, c.stages),
                sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, c.dv_wg, n), dt, c.stages))

    @staticmethod
    def row_copy_atom(dt):
        """The producer's 16-byte cp.async of Q rows (and gathered K/V rows). .cg: the rows go to smem
        only; .ca would also allocate them in the ~30 KB of L1 that the 216 KB of smem leaves, for no
        reuse."""
        return cute.make_copy_atom(cpasync.CopyG2SOp(cpasync.LoadCacheMode.GLOBAL), dt, num_bits_per_copy=128)

    def _io_tma(self, mQ, mO, sQ_layout):
        """Host side, traced in `__call__`: TMA atoms a variant uses for Q and / or O (kernels/fmha/
        prefill_v11.py), passed to the kernel as `io`; the shipped kernel has none."""
        return None

    def _q_full_arrivals(self) -> int:
        """Arrivals that complete Q's full barrier: one per producer thread's cp.async (a trace-time
        constant)."""
        return 128

    @cute.jit
    def _init_barriers(self, tidx, bars, counts, q_full, q_empty):
        """Thread 0 sets the arrive counts of the stage mbarriers (`counts`, from `bars` on: barriers.py)
        and of Q's (full: the 128 producer threads' cp.async arrivals; empty: every consumer thread);
        then the CTA waits until they are visible."""
        if tidx == 0:
            for i in cutlass.range_constexpr(len(counts)):
                cute.arch.mbarrier_init(bars + i, counts[i])
            cute.arch.mbarrier_init(q_full, self._q_full_arrivals())
            cute.arch.mbarrier_init(q_empty, 128 * self.cfg.n_consumer_wg)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (s_q, h_q, d, B) bf16
        mK: cute.Tensor,  # (s_kv, h_kv, d, B) bf16
        mV: cute.Tensor,  # (s_kv, h_kv, dv, B) bf16 (ignored when kv_shared)
        mIdx: cute.Tensor,  # (rows, n, B) int32: rows = s_q (per token) or query blocks
        mLen: cute.Tensor,  # (rows, B) int32: slots of each row's list to visit (<= n)
        mSink: cute.Tensor,  # (h_q,) fp32 logits; -inf where a head has no sink
        mO: cute.Tensor,  # (s_q, h_q, dv, B) bf16
        mLse: cute.Tensor,  # (s_q, h_q, B) fp32
        scale_log2: cutlass.Float32,  # softmax scale * log2(e)
        causal_off: cutlass.Int32,  # s_kv - s_q: query t is aligned to key t + off
        window: cutlass.Int32,  # block lists: window keys incl. the diagonal (huge = none)
        n_ctas: cutlass.Int32,  # persistent: CTAs to launch (the SM count); ignored otherwise
        stream: cuda.CUstream,
    ):
        c = self.cfg
        dt = mQ.element_type
        n = c.n_block
        qk_mma, pv_mma, pv_ss_mma = self.tiled_mmas(dt)
        sQ_layout, sK_layout, sV_layout, sP_layout = self.smem_layouts(dt)
        record("config", f"{c} n_block={n} threads={c.threads} hb={c.hb} tq={c.tq}")
        record("tiled MMA S = Q K^T (per warpgroup)", qk_mma)
        record("tiled MMA O += P V (per warpgroup, P from registers)", pv_mma)
        record("smem Q (rows, d) K-major", sQ_layout)
        record("smem K stages (keys, d, stage) K-major", sK_layout)
        if cutlass.const_expr(not c.kv_shared):
            record("smem V^T stages (dv, keys, stage) MN-major", sV_layout)
        if cutlass.const_expr(c.key_split):
            record("smem P of each tile of the pair (rows, keys, tile) K-major", sP_layout)
            record("tiled MMA O += P V (partner's P from smem)", pv_ss_mma)
        n_bars = 4 * c.stages + 2  # per stage: full/empty x (K, V), or x halves of d for a key split; + q full, empty

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, n_bars]
            sIdx: cute.struct.MemRange[cutlass.Int32, c.stages * n]
            sMaskFlag: cute.struct.MemRange[cutlass.Int32, c.stages * 4]
            sX: cute.struct.MemRange[cutlass.Float32, c.xchg_floats(n)]
            sP: cute.struct.Align[
                cute.struct.MemRange[dt, cute.cosize(sP_layout) if c.key_split else 8], 1024
            ]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[
                cute.struct.MemRange[dt, 8 if c.kv_shared else cute.cosize(sV_layout)], 1024
            ]

        tma = None
        if cutlass.const_expr(c.tma_kv):
            op = cpasync.CopyBulkTensorTileG2SOp()
            # (keys, d, h_kv, B) and (dv, keys, h_kv, B): the smem tiles' modes first
            mK_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[0, 2, 1, 3]))
            mV_t = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[2, 0, 1, 3]))
            tma = (
                *cpasync.make_tiled_tma_atom(op, mK_t, cute.slice_(sK_layout, (None, None, 0)), (n, c.d)),
                *cpasync.make_tiled_tma_atom(op, mV_t, cute.slice_(sV_layout, (None, None, 0)), (c.dv, n)),
            )
            record("TMA K box (keys, d) per tile", tma[1])
        io = self._io_tma(mQ, mO, sQ_layout)  # None: Q by the producer's cp.async, O by 16-byte stores
        n_rows = cute.size(mIdx, mode=[0])
        grid = (n_rows, cute.size(mK, mode=[1]) * c.n_hblk, cute.size(mQ, mode=[3]))
        if cutlass.const_expr(c.persistent):
            grid = (cutlass.min(grid[0] * grid[1] * grid[2], n_ctas), 1, 1)
        self.kernel(
            mQ, mK, mV, mIdx, mLen, mSink, mO, mLse, scale_log2, causal_off, window,
            qk_mma, pv_mma, pv_ss_mma, sQ_layout, sK_layout, sV_layout, sP_layout, Storage, tma, io,
        ).launch(grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mIdx: cute.Tensor,
        mLen: cute.Tensor,
        mSink: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale_log2: cutlass.Float32,
        causal_off: cutlass.Int32,
        window: cutlass.Int32,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        pv_ss_mma: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
        tma,  # (K atom, K coordinates, V atom, V coordinates) for block lists, else None
        io,  # a variant's TMA atoms for Q / O (`_io_tma`), else None
    ):
        c = self.cfg
        n = c.n_block
        S = c.stages
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        s_q = cute.size(mQ, mode=[0])
        s_kv = cute.size(mK, mode=[0])

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        # key split: full[stage, half], empty[stage, half]; else K full, K empty, V full, V empty per stage
        bars = st.bars.data_ptr()
        q_full, q_empty = bars + 4 * S, bars + 4 * S + 1
        sIdx = st.sIdx.get_tensor(cute.make_layout((n, S)))
        sMaskFlag = st.sMaskFlag.get_tensor(cute.make_layout((4, S)))
        sX = st.sX.get_tensor(cute.make_layout((c.xchg_floats(n),)))
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)[None, None, 0]
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        if cutlass.const_expr(c.kv_shared):
            # V^T (d, n, stage) is the K tile read MN-major: same bytes, modes swapped.
            sVt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        else:
            sVt = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        if cutlass.const_expr(c.key_split):
            record("mbarrier full (per stage and half of d): arrive count", "128 = the 64 producer threads of "
                   "that stage x (cp.async.mbarrier.arrive.noinc for the rows + mbarrier.arrive after the index store)")
            record("mbarrier empty (per stage and half of d): arrive count",
                   "128 = the one warpgroup that reads that half last, once per tile")
            counts = (128,) * (2 * S) + (128,) * (2 * S)
        else:
            n_cons = 128 * c.n_consumer_wg
            # K full: every producer thread arrives after its index stores, plus the rows' arrivals:
            # one per thread (cp.async.mbarrier.arrive.noinc), or one arrive.expect_tx for the TMA box
            k_full, v_full = (129, 1) if c.tma_kv else (256, 128)
            record("mbarrier K full / K empty / V full / V empty (per stage): arrive counts",
                   f"{k_full} / {n_cons} (every consumer thread once per tile) / {v_full} / {n_cons}"
                   + (" (TMA: + transaction bytes)" if c.tma_kv else " (cp.async arrivals)")
                   + (" -- V is K: V full/empty unused, K empty freed after PV" if c.kv_shared else ""))
            counts = (k_full,) * S + (n_cons,) * S + (v_full,) * S + (n_cons,) * S
        record("mbarrier q_full: arrive count", "128 = cp.async.mbarrier.arrive.noinc of each producer thread")
        if cutlass.const_expr(c.persistent):
            record("mbarrier q_empty: arrive count", "256 = every consumer thread, once its last QK of the item is done")
        self._init_barriers(tidx, bars, counts, q_full, q_empty)

        if wg == c.n_consumer_wg:
            # ---------------- producer warpgroup: gather Q once, then kv tiles ----------------
            cute.arch.setmaxregister_decrease(c.reg_split[0])
            ptid = tidx - 128 * c.n_consumer_wg
            atom = self.row_copy_atom(mQ.element_type)
            base = cutlass.Int32(0)  # key tiles of the earlier items: stages and phases run on across items
            for w in cutlass.range(self._items_of_cta(mIdx, mK, mQ), unroll=1):
                blk, bidx, kvh, head0, n_idx, n_tiles, tok0 = self._item(w, mIdx, mK, mQ, mLen)
                cute.arch.mbarrier_wait(q_empty, (w & 1) ^ 1)  # the previous item's last QK is done
                self._load_q(atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full)
                if cutlass.const_expr(c.key_split):
                    self._produce_pairs(atom, mIdx, mK, sK, sIdx, sMaskFlag, bars, ptid, blk, n_idx, n_tiles, s_kv, kvh,
                                        bidx, tok0, causal_off, window)
                else:
                    self._produce_tiles(atom, tma, mIdx, mK, mV, sK, sVt, sIdx, sMaskFlag, bars, ptid, blk, n_idx,
                                        n_tiles, s_kv, kvh, bidx, tok0, causal_off, window, base)
                base = base + n_tiles
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
        else:
            # ---------------- consumer warpgroups ----------------
            cute.arch.setmaxregister_increase(c.reg_split[1])
            if cutlass.const_expr(c.key_split):
                self._consume(
                    mQ, mK, mIdx, mLen, mO, mLse, mSink, scale_log2, causal_off, window, qk_mma, pv_mma, pv_ss_mma,
                    sQ, sK, sVt, sIdx, sMaskFlag, sX, st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner), bars,
                    wg, tidx % 128, io,
                )
            else:
                self._consume(
                    mQ, mK, mIdx, mLen, mO, mLse, mSink, scale_log2, causal_off, window, qk_mma, pv_mma, None,
                    sQ, sK, sVt, sIdx, sMaskFlag, sX, None, bars, wg, tidx % 128, io,
                )
