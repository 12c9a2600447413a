"""FP8 sparse decode (issue #25): one attention launch whose producer reads FlashMLA's FP8 rows
straight from the two paged caches (oracles/fmha_cache.py: the MODEL1 layout) and dequantises them
into the bf16 K tile in shared memory that the key-split consumers read: no bf16 W round trip.

The consumers, softmax, MMAs and epilogue are the key split's (consumer.py, key_split.py,
softmax.py, mma.py, epilogue.py), unchanged: this class is `GatherAttentionSm90` with its own
`__call__` / `kernel` (the key-split branch of kernel_sm90.py, with other arguments) and its own
producer. kernel_sm90.py is not touched, so the prefill kernel is the same code.

Work: rows = splits of a request (q's row stride 0, as v1: docs/lessons/fmha.md 29); row s of request
r walks the concatenated slot list of the request, slots [s * chunk, (s + 1) * chunk): slot j < k0 is
cache 0's slot j, else cache 1's slot j - k0; a slot is read when it is below its list's length and
its index is in [0, tokens). mLen[s, r] = chunk (a multiple of 128: whole pairs of 64-key tiles).

Producer (128 threads, the key split's two halves: threads 0-63 tile 2p in stage 0, 64-127 tile
2p + 1 in stage 1): decode_prefetch.py. Thread lt of a half owns rows lt // 8 + 8 q (q < 8) of its
tile and 16-byte chunk lt % 8 of each 64-value segment of d (a segment is one ue8m0 scale tile;
segment 7 the RoPE); a half's rows are loaded into registers in batches (8 e4m3 bytes per row and
segment, the half's 4 scale bytes in one 32-bit load, RoPE 16 bytes), converted by prmt + mul.bf16x2
(code * 2^(e - 127), exact in bf16) and stored as 16 bytes into the swizzled tile; a slot not read
stores zeros (its P is 0 and V must be finite). The full barrier of a half counts the 64 threads
once each (st.shared + fence.proxy.async + arrive), not the cp.async arrivals of the bf16 producer.
The set-aside v2 forms (f32 conversion, 2-row batches, a producer copy per cache, the no-dequant
knock-out, v3's unpacked pf-loop) are in git history at 1cdb2f1 (docs/perf/fmha.md).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import make_fake_tensor

from kernels.fmha.config import Config
from kernels.fmha.kernel_sm90 import GatherAttentionSm90
from kernels.trace import record


ROWS_PER_BATCH = 4  # rows of a thread whose loads are in flight together (registers: 11 a row and half)
REG_SPLIT = (88, 208)  # setmaxnreg (producer, consumer): the consumers spill at 200; 3 x 128 x (88 + 2 x 208) <= 64K


class FusedDecodeSm90(GatherAttentionSm90):
    """The key-split attention kernel (d = dv = 512, V = K), its FP8-gathering producer a subclass's
    `_produce` (decode_prefetch.FusedPackedLoop)."""

    pdl_combine = False  # the combine launched with PDL, this kernel letting it start at once (decode_forms)

    def __init__(self, cfg: Config):
        assert cfg.key_split and cfg.d == 512, cfg
        super().__init__(cfg)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (rows, h_q, d, B) bf16, rows of one request = its splits (stride 0)
        codes0: cute.Tensor, sc0: cute.Tensor, idx0: cute.Tensor, len0: cute.Tensor,
        codes1: cute.Tensor, sc1: cute.Tensor, idx1: cute.Tensor, len1: cute.Tensor,
        mLen: cute.Tensor,  # (rows, B) int32: the chunk (slots per row)
        mSink: cute.Tensor,  # (h_q,) fp32
        mO: cute.Tensor,  # (rows, h_q, dv, B) bf16
        mLse: cute.Tensor,  # (rows, h_q, B) fp32
        scale_log2: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        c = self.cfg
        dt = mQ.element_type
        n = c.n_block
        qk_mma, pv_mma, pv_ss_mma = self.tiled_mmas(dt)
        sQ_layout, sK_layout, _, sP_layout = self.smem_layouts(dt)  # V is K
        record("config", f"fused FP8 decode {c} n_block={n} threads={c.threads} rows/batch={ROWS_PER_BATCH} "
               f"setmaxnreg={REG_SPLIT}")
        record("smem K stages (keys, d, stage) K-major", sK_layout)
        n_bars = 4 * c.stages + 2

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, n_bars]
            sIdx: cute.struct.MemRange[cutlass.Int32, c.stages * n]
            sMaskFlag: cute.struct.MemRange[cutlass.Int32, c.stages * 4]
            sRows: cute.struct.MemRange[cutlass.Int32, n * 2 * c.stages]  # raw tokens (slot, buffer, stage)
            sX: cute.struct.MemRange[cutlass.Float32, c.xchg_floats(n)]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sP_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        grid = (cute.size(mLen, mode=[0]), c.n_hblk, cute.size(mQ, mode=[3]))
        io = self._io_tma(mQ, mO, sQ_layout)  # a form's O store by TMA (FusedEpiTma), else None
        self.kernel(
            mQ, codes0, sc0, idx0, len0, codes1, sc1, idx1, len1, mLen, mSink, mO, mLse, scale_log2,
            qk_mma, pv_mma, pv_ss_mma, sQ_layout, sK_layout, sP_layout, Storage, io,
        ).launch(grid=grid, block=[c.threads, 1, 1], stream=stream, **self._cluster_launch())

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        codes0: cute.Tensor, sc0: cute.Tensor, idx0: cute.Tensor, len0: cute.Tensor,
        codes1: cute.Tensor, sc1: cute.Tensor, idx1: cute.Tensor, len1: cute.Tensor,
        mLen: cute.Tensor,
        mSink: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale_log2: cutlass.Float32,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        pv_ss_mma: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
        io,
    ):
        c = self.cfg
        S = c.stages
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        s_q = cute.size(mQ, mode=[0])

        if cutlass.const_expr(self.pdl_combine):
            cute.arch.griddepcontrol_launch_dependents()  # the combine may launch (it waits for this grid's end)
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        bars = st.bars.data_ptr()  # full[stage, half] = bars + 2 stage + half, empty = + 4; q full, q empty
        q_full, q_empty = bars + 4 * S, bars + 4 * S + 1
        sIdx = st.sIdx.get_tensor(cute.make_layout((c.n_block, S)))
        sMaskFlag = st.sMaskFlag.get_tensor(cute.make_layout((4, S)))
        sRows = st.sRows.get_tensor(cute.make_layout((c.n_block, 2, S)))
        sX = st.sX.get_tensor(cute.make_layout((c.xchg_floats(c.n_block),)))
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)[None, None, 0]
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sVt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        record("mbarrier full (per stage and half of d): arrive count",
               "64 = the producer threads of that stage (st.shared + fence.proxy.async + arrive)")
        self._init_barriers(tidx, bars, (64,) * (2 * S) + (self._empty_count(),) * (2 * S), q_full, q_empty)
        self._cluster_sync(False)

        if wg == c.n_consumer_wg:
            cute.arch.setmaxregister_decrease(REG_SPLIT[0])
            ptid = tidx - 128 * c.n_consumer_wg
            atom = self.row_copy_atom(mQ.element_type)
            blk, bidx, kvh, head0, n_idx, n_tiles, tok0 = self._item(Int32(0), mLen, mLen, mQ, mLen)
            self._fetch_q(atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full)
            caches = (codes0, sc0, idx0, len0, codes1, sc1, idx1, len1)
            self._produce(caches, sK, sRows, sIdx, sMaskFlag, bars, ptid, blk, bidx, n_idx, n_tiles)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
        else:
            cute.arch.setmaxregister_increase(REG_SPLIT[1])
            self._consume(
                mQ, mLen, mLen, mLen, mO, mLse, mSink, scale_log2, Int32(0), Int32(1 << 30), qk_mma, pv_mma,
                pv_ss_mma, sQ, sK, sVt, sIdx, sMaskFlag, sX, st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner),
                bars, wg, tidx % 128, io,
            )
        self._cluster_sync(True)

    # Seams of a clustered form (decode_pair.py); a CTA of its own here: no cluster, the empty barrier of a
    # K half counts one warpgroup's 128 consumer threads, a row stored into this CTA only.
    def _cluster_launch(self) -> dict:
        return {}

    def _empty_count(self) -> int:
        return 128

    def _cluster_sync(self, at_exit: bool):
        pass

    def _peer_addresses(self, local, full):
        """(the peer's address of `local`, of the barrier `full`) for a paired form's stores."""
        return local, Int32(0)

    def _store_peer(self, vals, peer, imm, peer_bar):
        pass

    def _fetch_q(self, atom, io, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx, q_full):
        """Producer: the CTA's 64 heads of Q by 32 cp.async a thread, counted on q_full (a seam:
        decode_forms.QByTma loads it by TMA)."""
        self._copy_q(atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx)
        cute.arch.cp_async_mbarrier_arrive_noinc(q_full)

    # ------------------------------------------------------------------ the slot rule (producer: decode_prefetch.py)
    @cute.jit
    def _k0_padded(self, idx0):
        """Slots of cache 0 in the request's list: its list width rounded up to whole tiles, so that
        every tile reads one cache (a warp-uniform branch per tile, not per row)."""
        n = self.cfg.n_block
        return (cute.size(idx0, mode=[1]) + n - 1) // n * n

    @cute.jit
    def _copy_slot(self, caches, sRows, bidx, j, t):
        """cp.async (4 bytes) of slot j's raw token from its list into sRows[t]; nothing where the
        slot is in neither list (it is invalid whatever sRows holds)."""
        _, _, idx0, _, _, _, idx1, _ = caches
        k0p = self._k0_padded(idx0)
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cpasync.LoadCacheMode.ALWAYS), Int32, num_bits_per_copy=32)
        dst = cute.local_tile(sRows, (1,), (t,))
        if j < cute.size(idx0, mode=[1]):
            cute.copy(atom, cute.local_tile(idx0[bidx, None], (1,), (j,)), dst)
        elif (j >= k0p) & (j - k0p < cute.size(idx1, mode=[1])):
            cute.copy(atom, cute.local_tile(idx1[bidx, None], (1,), (j - k0p,)), dst)

    @cute.jit
    def _valid_token(self, caches, lens, j, v):
        """Slot j's token v if the slot is read (in its list, below the list's length `lens` of its cache,
        v in [0, tokens)), else -1."""
        codes0, _, idx0, _, codes1, _, idx1, _ = caches
        k0p = self._k0_padded(idx0)
        ok = (j < cute.size(idx0, mode=[1])) & (j < lens[0])
        ok = ok & (v < cute.size(codes0, mode=[0]) * cute.size(codes0, mode=[1]))
        j1 = j - k0p
        ok1 = (j1 >= 0) & (j1 < cute.size(idx1, mode=[1])) & (j1 < lens[1])
        ok1 = ok1 & (v < cute.size(codes1, mode=[0]) * cute.size(codes1, mode=[1]))
        return cutlass.select_((ok | ok1) & (v >= 0), v, Int32(-1))

    @cute.jit
    def _select_cache(self, caches, second):
        """(codes, scales) of cache 1 if `second` else cache 0, as tensors over a selected base address,
        block count, block size and block stride (the token strides are the layout's: 576 B, 8 B), with the
        alignments the fake tensors promise. The producer reads a row's RoPE as bytes 448-575 of its codes
        row (v7): the kernel takes no rope view."""
        codes0, sc0, _, _, codes1, sc1, _, _ = caches
        nb = cutlass.select_(second, cute.size(codes1, mode=[0]), cute.size(codes0, mode=[0]))
        bs = cutlass.select_(second, cute.size(codes1, mode=[1]), cute.size(codes0, mode=[1]))
        out = []
        for t0, t1, n_last, row, align, div in ((codes0, codes1, 448, 576, 16, 16), (sc0, sc1, 8, 8, 8, 8)):
            addr = cutlass.select_(second, t1.iterator.toint(), t0.iterator.toint())
            ptr = cute.make_ptr(t0.element_type, addr, cute.AddressSpace.gmem, assumed_align=align)
            blk = cutlass.select_(second, t1.layout.stride[0] // div, t0.layout.stride[0] // div) * div
            out.append(cute.make_tensor(ptr, cute.make_layout((nb, bs, n_last), stride=(blk, row, 1))))
        return tuple(out)


def fake_args() -> tuple:
    """Fake tensors: q (rows, h, 512, b) with a row stride, both caches' views (their token strides
    fixed by the layout), lists, lengths, the chunk lengths, sink, O, LSE."""
    from kernels.fmha.decode_fp8 import fake_args as gather_fake_args

    g = gather_fake_args()
    caches = g[0], *g[2:5], g[5], *g[7:10]  # (codes, scales, list, lengths) a cache: no rope view
    rows, h, b = (cute.sym_int32() for _ in range(3))

    def s8():
        return cute.sym_int64(divisibility=8)

    bf = BFloat16
    q = make_fake_tensor(bf, (rows, h, 512, b), (s8(), s8(), 1, s8()), assumed_align=16)
    lens = make_fake_tensor(Int32, (rows, b), (1, cute.sym_int64()), assumed_align=4)
    sink = make_fake_tensor(Float32, (h,), (1,), assumed_align=4)
    o = make_fake_tensor(bf, (rows, h, 512, b), (s8(), s8(), 1, s8()), assumed_align=16)
    lse = make_fake_tensor(Float32, (rows, h, b), (cute.sym_int64(), cute.sym_int64(), cute.sym_int64()),
                           assumed_align=4)
    return (q, *caches, lens, sink, o, lse, Float32(1.0))
