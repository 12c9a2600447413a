"""Gathered-key attention for Hopper (SM90) in CuTeDSL: head_dim up to 512, sink, masks, LSE.

One formulation covers DSV4 sparse attention (CSA top-k + window, HCA, SWA-only) and the general
dense FMHA sweep: each CTA owns a block of query rows and walks a list of key indices
`idx[block, :len[block]]` (-1 = invalid) in tiles of `n_block` keys. Dense causal / sliding-window
masks are the same list (the block's key range: contiguous, ascending, -1 padded at the end) plus a
positional mask evaluated in registers, only on tiles the producer flags.

CTA geometry (rows of the M tile = (query token, head) pairs, heads fastest):
  * `hb` heads of one kv group times `tq` query tokens fill the M tile (64 or 128 rows). MQA / GQA
    decode packs all heads of a token into M; per-token index lists force tq = 1.
  * Warp specialization: one producer warpgroup fills swizzled smem stages (an mbarrier
    pipeline, K and V with their own full/empty barriers): block lists as one TMA box per tile
    (K, then V), per-token lists by gathering rows with 16-byte cp.async.cg; `n_mrow x n_dsplit`
    consumer warpgroups run the math.
  * d <= 256: two consumer warpgroups own 64 rows each, the full head dim, and take turns (named
    barriers): one issues S(kt) = Q K^T and PV(kt-1), then runs the softmax of S(kt) while the
    other's GEMMs run (`_pingpong`).
  * dv = 512: the PV accumulator (64 x 512 fp32 = 256 registers/thread) does not fit one
    warpgroup, so two warpgroups share 64 rows, each owning a 256-wide slice of O.
    - V = K (the DSV4 latent, `Config.key_split`): the warpgroups take alternate 64-key tiles
      over the full d, agree on the row max through smem and trade their bf16 P (stmatrix, SS
      wgmma for the partner's P); each half of d of a tile has its own full/empty barriers, and
      each tile of a pair its own 64 producer threads (row indices in registers), so the half
      freed last in one tile never holds up the other's gather.
    - V != K: S = Q K^T is split along d; the two fp32 partials are exchanged through smem.
    No QK work is duplicated in either.
  * Per tile: QK wgmma -> masked online softmax (exp2, fp32) -> PV wgmma (P from registers, V from
    smem read MN-major). When K is V (the DSV4 latent) one smem tile serves both GEMMs: V^T is a
    transposed view of the K tile.
  * Epilogue: O /= (row_sum + exp(sink - row_max)), staged through smem (the Q buffer) and written
    with 16-byte stores; natural-log LSE (sink-free).

Loops over key tiles are runtime loops (`cutlass.range(..., unroll=1)`); only MMA k-blocks and the
per-thread copy/softmax bodies are unrolled, so compile time stays flat in head_dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.trace import record

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SMEM_BUDGET = 227 * 1024  # dynamic smem per CTA on the H100 (the kernel's Storage, 1 KiB-aligned regions)
BAR_XCHG_S1, BAR_XCHG_S0, BAR_EPILOGUE, BAR_PRODUCER = 1, 2, 3, 4  # named barriers (0 = __syncthreads)
BAR_MAX0, BAR_MAX1, BAR_P0, BAR_P1, BAR_SUMS = 5, 6, 7, 8, 9  # key split: WG0 max, final max, sP0, sP1, row sums
BAR_TURN0 = 10  # ping-pong (d <= 256): BAR_TURN0 + w opens warpgroup w's turn to issue its GEMMs
MAX_INIT = -1.0e30  # key split: a finite initial row max, so a fully masked tile needs no special case


@dataclass(frozen=True)
class Config:
    """Everything that changes the compiled code."""

    d: int  # q/k head dim
    dv: int  # v / output head dim
    hpg: int  # query heads per kv head
    kv_shared: bool  # V is K (MQA latent): one smem tile for both GEMMs
    per_token_idx: bool  # indices per query token (sparse); else a contiguous key range per query block
    causal: bool = False  # positional causal mask (block lists only); the window is a runtime value

    def __post_init__(self) -> None:
        if self.d % 64 or not 64 <= self.d <= 512:
            raise ValueError(f"head_dim {self.d} unsupported (multiple of 64 in 64..512)")
        if self.dv % 64 or not 64 <= self.dv <= 512 or (self.dv > 256 and self.dv % 256):
            raise ValueError(f"value dim {self.dv} unsupported (64..256 step 64, or 512)")
        if self.d != self.dv:
            raise ValueError("this kernel needs d == dv (O is staged in the Q buffer)")
        if self.n_dsplit > 1 and self.d % (64 * self.n_dsplit):
            raise ValueError("split QK needs d divisible by 64 per warpgroup")

    @property
    def key_split(self) -> bool:
        """dv = 512 with V = K (the DSV4 latent): the two consumer warpgroups take alternate key
        tiles over the full d instead of halves of d, each owns half of O, and they trade the
        row max and the bf16 P through smem (see `_consume_key_split`)."""
        return self.kv_shared and self.n_dsplit > 1

    @property
    def persistent(self) -> bool:
        """Causal, d <= 256 (ping-pong): one CTA per SM walks work items (query block x head block
        x batch) in a fixed snake order, longest causal lists first, so the SMs finish together and
        the producer loads the next item's Q and first tiles under the current item's last ones.
        Lists of equal length (no mask, window, sparse) gain nothing from it on the H100 and lose
        the staged epilogue (docs/perf/fmha.md, v7): they keep one CTA per item, as does dv = 512."""
        return self.n_dsplit == 1 and self.causal

    @property
    def tma_kv(self) -> bool:
        """Block lists (dense masks) are contiguous key ranges, -1 padded: a tile's K and V rows
        are one box each from its first key, loaded by TMA; per-token lists are gathered."""
        return not self.per_token_idx

    @property
    def n_dsplit(self) -> int:
        return max(1, self.dv // 256)

    @property
    def dv_wg(self) -> int:
        return self.dv // self.n_dsplit

    @property
    def n_mrow(self) -> int:
        return 1 if self.n_dsplit > 1 else 2

    @property
    def m_cta(self) -> int:
        return 64 * self.n_mrow

    @property
    def n_consumer_wg(self) -> int:
        return self.n_mrow * self.n_dsplit

    @property
    def threads(self) -> int:
        return 128 * (self.n_consumer_wg + 1)

    @property
    def hb(self) -> int:
        """Heads per CTA (rows of one token)."""
        return self.m_cta if self.per_token_idx and self.hpg >= self.m_cta else min(self.hpg, self.m_cta)

    @property
    def tq(self) -> int:
        """Query tokens per CTA; the index list is shared by them."""
        return 1 if self.per_token_idx else self.m_cta // self.hb

    @property
    def n_hblk(self) -> int:
        return -(-self.hpg // self.hb)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer, consumer) of 3 x 128 threads (<= 64K registers): the key split's
        producer keeps a pair's row indices in registers (72); elsewhere the consumers take 232."""
        return (72, 216) if self.key_split else (40, 232)

    @property
    def stages(self) -> int:
        return 2

    def smem_bytes(self, n_block: int) -> int:
        """The kernel's Storage: a small header (barriers, indices, mask flags, exchange), then
        the P, Q, K and V regions, each 1 KiB-aligned."""
        def kib(b: int) -> int:
            return -(-b // 1024) * 1024

        S = self.stages
        header = 8 * (4 * S + 2) + 4 * S * (n_block + 4) + 4 * self.xchg_floats(n_block)
        p_tiles = 2 * S * 64 * n_block if self.key_split else 16
        v_tiles = 16 if self.kv_shared else 2 * S * n_block * self.dv
        return kib(header) + kib(p_tiles) + kib(2 * self.m_cta * self.d) + kib(2 * S * n_block * self.d) + kib(v_tiles)

    def xchg_floats(self, n_block: int) -> int:
        """fp32 smem shared by the two warpgroups of a split: the partial S (d split), or the row
        max (64) plus every thread's two partial row sums (key split)."""
        if self.key_split:
            return 64 + 2 * 128 * 2
        return 64 * n_block if self.n_dsplit > 1 else 1

    @property
    def n_block(self) -> int:
        """Keys per tile: the largest that fits smem and keeps S + O in registers (at dv 256, S and
        P of 80 keys + O: ~190 of the 232 registers; 80 rather than 64 keys per tile takes the
        per-tile overheads over more MMA work)."""
        cap = 80 if self.dv_wg >= 256 else 128
        if self.key_split:  # the 128 producer threads load one index of each of the pair's two tiles
            if self.smem_bytes(64) > SMEM_BUDGET:
                raise ValueError(f"the key-split tiles do not fit shared memory for {self}")
            return 64
        for n in (128, 80, 64, 32):
            if n <= cap and self.smem_bytes(n) <= SMEM_BUDGET:
                return n
        raise ValueError(f"no key tile fits shared memory for {self}")


def _mn_view(acc: cute.Tensor) -> cute.Tensor:
    """SM90 accumulator ((2,2,V),M,N) viewed as (rows, cols) of this thread: ((2,M),(2,V,N))."""
    cm = cute.make_layout(acc.layout.shape)
    mn = cute.make_layout(
        ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[0][2], cm.shape[2])),
        stride=((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[0][2], cm.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def _acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """C fragment ((2,2,N/8),M,1) of a 64xN bf16 tile as the A fragment ((2,2,2),M,N/16) of PV."""
    l = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    lay = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=(
            (l.stride[0][0], l.stride[0][1], l.stride[0][2][0]),
            l.stride[1],
            (l.stride[0][2][1], l.stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, lay)


@dsl_user_op
def _pin(x: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """An empty asm that takes and returns x: whatever computes x must run before it."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [x.ir_value(loc=loc, ip=ip)], "", "=r,0", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@cute.jit
def _fence_operand(frag: cute.Tensor):
    """Materialize a register operand before the wgmma that reads it (CUTLASS's
    warpgroup_fence_operand): otherwise the compiler sinks P's bf16 conversion between the wgmma
    issues and ptxas injects a warpgroup.arrive before each one (C7519)."""
    words = cute.recast_tensor(frag, cutlass.Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = _pin(words[i])


@cute.jit
def _any_moved(corr: cute.Tensor) -> cutlass.Boolean:
    """Whether some row of this warp has a rescale factor != 1. Exactly 1 when the row max did not
    move, the common case after the first tiles: skipping O *= 1 (and P's recomputation) is exact."""
    moved = corr[0] != 1.0
    for r in cutlass.range_constexpr(1, cute.size(corr)):
        moved = moved | (corr[r] != 1.0)
    return cute.arch.vote_any_sync(moved)


@cute.jit
def _scale_rows(X_mn: cute.Tensor, factor: cute.Tensor):
    for r in cutlass.range_constexpr(cute.size(X_mn, mode=[0])):
        for cc in cutlass.range(cute.size(X_mn, mode=[1]), unroll_full=True):
            X_mn[r, cc] = X_mn[r, cc] * factor[r]


@cute.jit
def _row_max(S_mn: cute.Tensor, r: cutlass.Constexpr) -> cutlass.Float32:
    """Max of row r of S over the quad of threads sharing it; 4 independent chains, so a max of
    64 is not 64 deep."""
    part = [S_mn[r, q] for q in range(4)]
    for cc in cutlass.range_constexpr(4, cute.size(S_mn, mode=[1])):
        part[cc % 4] = cute.arch.fmax(part[cc % 4], S_mn[r, cc])
    return _quad_allreduce(cute.arch.fmax(cute.arch.fmax(part[0], part[1]), cute.arch.fmax(part[2], part[3])),
                           cute.arch.fmax)


def _quad_allreduce(x: cutlass.Float32, op) -> cutlass.Float32:
    """Reduce over the 4 threads of a quad that share an accumulator row."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return op(x, cute.arch.shuffle_sync_bfly(x, offset=2))


class GatherAttentionSm90:
    def __init__(self, cfg: Config):
        self.cfg = cfg

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
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (1, 1, 1), (64, n),
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            cutlass.Float32, (1, 1, 1), (64, c.dv_wg), warpgroup.OperandSource.RMEM,
        )
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (c.m_cta, n, c.d), dt, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (64, n, c.d), dt, c.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (64, c.dv, n), dt, c.stages)
        # key split: the partner's P (64 x n, one per tile of the pair) as the smem A operand of PV
        pv_ss_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            cutlass.Float32, (1, 1, 1), (64, c.dv_wg),
        )
        sP_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, c.dv_wg, n), dt, c.stages)
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
        n_rows = cute.size(mIdx, mode=[0])
        grid = (n_rows, cute.size(mK, mode=[1]) * c.n_hblk, cute.size(mQ, mode=[3]))
        if cutlass.const_expr(c.persistent):
            grid = (cutlass.min(grid[0] * grid[1] * grid[2], n_ctas), 1, 1)
        self.kernel(
            mQ, mK, mV, mIdx, mLen, mSink, mO, mLse, scale_log2, causal_off, window,
            qk_mma, pv_mma, pv_ss_mma, sQ_layout, sK_layout, sV_layout, sP_layout, Storage, tma,
        ).launch(grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.jit
    def _copy_q(self, atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx):
        """Producer: the CTA's Q rows, row r = (token tok0 + r // hb, head head0 + r % hb); rows past
        the end (or past the kv group) read row 0 and are never stored."""
        c = self.cfg
        cpr = c.d // 8  # 16-byte chunks per row
        rpp = 128 // cpr  # rows per pass of the 128 producer threads
        chunk = ptid % cpr
        if cutlass.const_expr(c.persistent):
            # a runtime loop: unrolled, the row offsets of every pass are invariants of the persistent
            # item loop, hoisted out of it into the producer's 40 registers (spilled up to 72 B)
            for p in cutlass.range(c.m_cta // rpp, unroll=1):
                self._copy_q_row(atom, mQ, sQ, p * rpp + ptid // cpr, chunk, tok0, head0, kvh, s_q, bidx)
        else:  # one item per CTA: unrolled, all the passes' copies are issued back to back (a
            # runtime loop here cost the key split ~10%: docs/perf/fmha.md, v7 regression)
            for p in cutlass.range_constexpr(c.m_cta // rpp):
                self._copy_q_row(atom, mQ, sQ, p * rpp + ptid // cpr, chunk, tok0, head0, kvh, s_q, bidx)

    @cute.jit
    def _copy_q_row(self, atom, mQ, sQ, r, chunk, tok0, head0, kvh, s_q, bidx):
        """This thread's 16-byte chunk of Q row r of the CTA."""
        c = self.cfg
        tok = tok0 + r // c.hb
        hl = r % c.hb
        ok = (tok < s_q) & (head0 + hl - kvh * c.hpg < c.hpg) & (r < c.hb * c.tq)
        src = mQ[tok if ok else 0, head0 + hl if ok else 0, None, bidx]
        cute.copy(atom, cute.local_tile(src, (8,), (chunk,)), cute.local_tile(sQ[r, None], (8,), (chunk,)))

    @cute.jit
    def _copy_kv(self, atom, sIdx, mT, dst, seg0: int, n_segs: int, ptid, stage, kvh, bidx):
        """Producer: gather 128-byte segments [seg0, seg0 + n_segs) of the tile's kv rows (keys from
        sIdx[:, stage]) into dst (keys, d). 8 threads copy one segment, so a thread copies its
        segments of rows g, g + 16, ... (g = ptid // 8) and computes each row's address once:
        ~3 instructions per 16-byte cp.async instead of ~23 with one row per copy, which made the
        gather the bound (docs/perf/fmha.md). A runtime row loop: unrolled, the compiler hoists
        every swizzled smem address to the kernel entry and they spill. Invalid slots (-1) read
        row 0: the consumers mask them, so their P is exactly 0."""
        for k in cutlass.range(self.cfg.n_block // 16, unroll=1):
            r = ptid // 8 + 16 * k
            src = mT[cutlass.max(sIdx[r, stage], 0), kvh, None, bidx]
            for sg in cutlass.range_constexpr(n_segs):
                chunk = (seg0 + sg) * 8 + ptid % 8
                cute.copy(atom, cute.local_tile(src, (8,), (chunk,)), cute.local_tile(dst[r, None], (8,), (chunk,)))

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
        if tidx == 0:
            for i in cutlass.range_constexpr(4 * S):
                cute.arch.mbarrier_init(bars + i, counts[i])
            cute.arch.mbarrier_init(q_full, 128)
            cute.arch.mbarrier_init(q_empty, 128 * c.n_consumer_wg)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        if wg == c.n_consumer_wg:
            # ---------------- producer warpgroup: gather Q once, then kv tiles ----------------
            cute.arch.setmaxregister_decrease(c.reg_split[0])
            ptid = tidx - 128 * c.n_consumer_wg
            # .cg: the rows go to smem only; .ca would also allocate them in the ~30 KB of L1 that
            # the 216 KB of smem leaves, for no reuse
            atom = cute.make_copy_atom(
                cpasync.CopyG2SOp(cpasync.LoadCacheMode.GLOBAL), mQ.element_type, num_bits_per_copy=128
            )
            base = cutlass.Int32(0)  # key tiles of the earlier items: stages and phases run on across items
            for w in cutlass.range(self._items_of_cta(mIdx, mK, mQ), unroll=1):
                blk, bidx, kvh, head0, n_idx, n_tiles, tok0 = self._item(w, mIdx, mK, mQ, mLen)
                cute.arch.mbarrier_wait(q_empty, (w & 1) ^ 1)  # the previous item's last QK is done
                self._copy_q(atom, mQ, sQ, ptid, tok0, head0, kvh, s_q, bidx)
                cute.arch.cp_async_mbarrier_arrive_noinc(q_full)
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
                    wg, tidx % 128,
                )
            else:
                self._consume(
                    mQ, mK, mIdx, mLen, mO, mLse, mSink, scale_log2, causal_off, window, qk_mma, pv_mma, None,
                    sQ, sK, sVt, sIdx, sMaskFlag, sX, None, bars, wg, tidx % 128,
                )

    @cute.jit
    def _items_of_cta(self, mIdx, mK, mQ):
        """How many work items this CTA runs: one per CTA, or (persistent) its share of the snake
        order: round k hands item k * G + c to CTA c (k even) or to CTA G - 1 - c (k odd)."""
        if cutlass.const_expr(not self.cfg.persistent):
            return cutlass.Int32(1)
        n_items = cute.size(mIdx, mode=[0]) * cute.size(mK, mode=[1]) * self.cfg.n_hblk * cute.size(mQ, mode=[3])
        g, _, _ = cute.arch.grid_dim()
        cta, _, _ = cute.arch.block_idx()
        full = n_items // g
        last = full * g + cutlass.select_(full % 2 == 0, cta, g - 1 - cta)
        return full + cutlass.select_(last < n_items, cutlass.Int32(1), cutlass.Int32(0))

    @cute.jit
    def _item(self, w, mIdx, mK, mQ, mLen):
        """Work item w of this CTA: (query block, batch, kv head, first query head, list length,
        key tiles, first query token). Persistent order: a (head block, batch) pair's query blocks
        are adjacent, last block first: its K/V stay in L2 while the CTAs of a round share them,
        and a round starts with the longest causal lists."""
        c = self.cfg
        if cutlass.const_expr(c.persistent):
            n_rows = cute.size(mIdx, mode=[0])
            n_hblk_all = cute.size(mK, mode=[1]) * c.n_hblk
            g, _, _ = cute.arch.grid_dim()
            cta, _, _ = cute.arch.block_idx()
            i = w * g + cutlass.select_(w % 2 == 0, cta, g - 1 - cta)
            blk = n_rows - 1 - i % n_rows
            hblk_all = (i // n_rows) % n_hblk_all
            bidx = i // (n_rows * n_hblk_all)
        else:
            blk, hblk_all, bidx = cute.arch.block_idx()
        kvh = hblk_all // c.n_hblk
        head0 = kvh * c.hpg + (hblk_all % c.n_hblk) * c.hb  # first query head of the item
        n_idx = mLen[blk, bidx]
        n_tiles = cutlass.max((n_idx + c.n_block - 1) // c.n_block, 1)  # >= 1: an empty list is one masked tile
        return blk, bidx, kvh, head0, n_idx, n_tiles, blk * c.tq

    @cute.jit
    def _produce_tiles(self, atom, tma, mIdx, mK, mV, sK, sVt, sIdx, sMaskFlag, bars, ptid, blk, n_idx, n_tiles, s_kv,
                       kvh, bidx, tok0, causal_off, window, base):
        """Producer, one smem stage per key tile: the indices (one global load per slot, issued a
        tile ahead) and whether any key of the tile needs the mask for some row of the CTA (one
        flag per producer warp), then the K rows, then the V rows, each with its own full barrier:
        K is freed after the softmax, V after PV. Rows come by TMA (block lists) or by the gather.
        `base` counts the key tiles of the CTA's earlier items (stage and phase continue from it)."""
        c = self.cfg
        n, S = c.n_block, c.stages
        n_slots = cute.size(mIdx, mode=[1])
        k_full, k_empty, v_full, v_empty = bars, bars + S, bars + 2 * S, bars + 3 * S
        v_next = mIdx[blk, cutlass.min(ptid, n_slots - 1), bidx]
        for kt in cutlass.range(n_tiles, unroll=1):
            stage = (base + kt) % S
            phase = (((base + kt) // S) & 1) ^ 1
            j = kt * n + ptid
            v = v_next
            if (j >= n_idx) | (v >= s_kv) | (v < 0):
                v = cutlass.Int32(-1)
            v_next = mIdx[blk, cutlass.min(j + n, n_slots - 1), bidx]
            plain = (ptid >= n) | self._key_ok(v, tok0, tok0 + c.tq - 1, causal_off, window)
            cute.arch.mbarrier_wait(k_empty + stage, phase)
            if ptid < n:
                sIdx[ptid, stage] = v
            warp_plain = cutlass.Int32(cute.arch.vote_all_sync(plain))
            if ptid % 32 == 0:
                sMaskFlag[ptid // 32, stage] = warp_plain
            if cutlass.const_expr(c.tma_kv):
                # warp 0, one box per tile: slot 0 holds the first key (-1: an all-invalid tile)
                first = cute.arch.shuffle_sync(cutlass.max(v, 0), 0)
                tma_k, mK_c, tma_v, mV_c = tma
                if ptid < 32:
                    self._tma_load(tma_k, mK_c[None, None, kvh, bidx], (first, 0), (n, c.d), sK, stage, k_full + stage)
                cute.arch.mbarrier_arrive(k_full + stage)
                if cutlass.const_expr(not c.kv_shared):
                    if ptid < 32:
                        cute.arch.mbarrier_wait(v_empty + stage, phase)
                        self._tma_load(tma_v, mV_c[None, None, kvh, bidx], (0, first), (c.dv, n), sVt, stage,
                                       v_full + stage)
            else:
                cute.arch.barrier(barrier_id=BAR_PRODUCER, number_of_threads=128)
                self._copy_kv(atom, sIdx, mK, sK[None, None, stage], 0, c.d // 64, ptid, stage, kvh, bidx)
                cute.arch.cp_async_mbarrier_arrive_noinc(k_full + stage)
                cute.arch.mbarrier_arrive(k_full + stage)
                if cutlass.const_expr(not c.kv_shared):
                    sV_rows = cute.make_tensor(sVt.iterator, cute.select(sVt.layout, mode=[1, 0, 2]))
                    cute.arch.mbarrier_wait(v_empty + stage, phase)
                    self._copy_kv(atom, sIdx, mV, sV_rows[None, None, stage], 0, c.dv // 64, ptid, stage, kvh, bidx)
                    cute.arch.cp_async_mbarrier_arrive_noinc(v_full + stage)

    @cute.jit
    def _tma_load(self, atom, coords, offset, tile: tuple, dst, stage, bar):
        """One warp: the box `tile` at `offset` of coords (keys past s_kv arrive as zeros) into
        dst[:, :, stage]; bar expects its bytes. The copy elects its issuing lane itself
        (elect.sync over the full warp): called from one thread, it never returns."""
        g = cute.local_tile(cute.domain_offset(offset, coords), tile, (0, 0))
        t_s, t_g = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(dst, 0, 2),
                                         cute.group_modes(g, 0, 2))
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, cute.size_in_bytes(dst.element_type, cute.make_layout(tile)))
        cute.copy(atom, t_g, t_s[None, stage], tma_bar_ptr=bar)

    @cute.jit
    def _produce_pairs(self, atom, mIdx, mK, sK, sIdx, sMaskFlag, bars, ptid, blk, n_idx, n_tiles, s_kv, kvh, bidx,
                       tok0, causal_off, window):
        """Producer of a key split: each half of the producer warpgroup owns one tile of every pair,
        threads 0-63 tile 2p (warpgroup 0's, stage 0: left then right half of d), threads 64-127
        tile 2p + 1 (warpgroup 1's, stage 1: right then left), so the half of d freed last in one
        tile never holds up the other tile's gather (v9, docs/perf/fmha.md)."""
        args = (atom, mIdx, mK, sK, sIdx, sMaskFlag, bars)
        tail = (blk, n_idx, n_tiles, s_kv, kvh, bidx, tok0, causal_off, window)
        if ptid < self.cfg.n_block:
            self._produce_tile_of_pairs(*args, ptid, *tail, 0)
        else:
            self._produce_tile_of_pairs(*args, ptid - self.cfg.n_block, *tail, 1)

    @cute.jit
    def _produce_tile_of_pairs(self, atom, mIdx, mK, sK, sIdx, sMaskFlag, bars, lt, blk, n_idx, n_tiles, s_kv, kvh,
                               bidx, tok0, causal_off, window, stage: cutlass.Constexpr):
        """Tile 2p + stage of every pair p into `stage`, by 64 threads. Thread lt publishes slot lt's
        index for the mask (and each warp whether all its keys pass it) and copies 16-byte chunk
        lt % 8 of each 128-byte segment of rows lt // 8 + 8 q; the row indices of the next pair are
        loaded into registers while this pair's rows are copied, so no copy waits on shared memory
        or on the other producer threads."""
        c = self.cfg
        n = c.n_block
        n_slots = cute.size(mIdx, mode=[1])
        n_rows = n // 8  # rows of the tile this thread copies
        rows_next = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
        rows_now = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
        for q in cutlass.range_constexpr(n_rows):
            rows_next[q] = mIdx[blk, cutlass.min(stage * n + lt // 8 + 8 * q, n_slots - 1), bidx]
        mine_next = mIdx[blk, cutlass.min(stage * n + lt, n_slots - 1), bidx]
        for pair in cutlass.range((n_tiles + 1) // 2, unroll=1):
            j0 = (2 * pair + stage) * n
            for q in cutlass.range_constexpr(n_rows):
                v = rows_next[q]
                if (j0 + lt // 8 + 8 * q >= n_idx) | (v >= s_kv) | (v < 0):
                    v = cutlass.Int32(0)  # an invalid slot reads row 0; the mask zeroes its P
                rows_now[q] = v
                rows_next[q] = mIdx[blk, cutlass.min(j0 + 2 * n + lt // 8 + 8 * q, n_slots - 1), bidx]
            mine = mine_next
            if (j0 + lt >= n_idx) | (mine >= s_kv) | (mine < 0):
                mine = cutlass.Int32(-1)
            mine_next = mIdx[blk, cutlass.min(j0 + 2 * n + lt, n_slots - 1), bidx]
            plain = self._key_ok(mine, tok0, tok0 + c.tq - 1, causal_off, window)
            # pinned each pair: the 2 x n_rows x segs swizzled smem addresses derive from it inside
            # the loop instead of being hoisted out of it into the producer's registers
            t = _pin(lt)
            phase = (pair & 1) ^ 1
            for k in cutlass.range_constexpr(2):
                h = (stage + k) % 2  # stage 0 reads left first, stage 1 right first
                hb = stage * 2 + h
                # the first wait also covers the indices: the owner's mask read them before it
                # freed the half it multiplies locally (0-left, 1-right)
                cute.arch.mbarrier_wait(bars + 4 + hb, phase)
                if cutlass.const_expr(k == 0):
                    sIdx[lt, stage] = mine
                    warp_plain = cutlass.Int32(cute.arch.vote_all_sync(plain))
                    if lt % 32 == 0:
                        sMaskFlag[lt // 32, stage] = warp_plain
                self._copy_half_rows(atom, mK, sK[None, None, stage], rows_now, t, h, kvh, bidx)
                cute.arch.cp_async_mbarrier_arrive_noinc(bars + hb)
                cute.arch.mbarrier_arrive(bars + hb)

    @cute.jit
    def _copy_half_rows(self, atom, mK, dst, rows, t, h: int, kvh, bidx):
        """Key split: half h of d of kv rows `rows` into rows t // 8 + 8 q of dst (keys, d), as the
        16-byte chunks t % 8 of each 128-byte segment."""
        segs = self.cfg.d // 2 // 64
        for q in cutlass.range_constexpr(cute.size(rows)):
            src = mK[rows[q], kvh, None, bidx]
            for sg in cutlass.range_constexpr(segs):
                chunk = (h * segs + sg) * 8 + t % 8
                cute.copy(atom, cute.local_tile(src, (8,), (chunk,)),
                          cute.local_tile(dst[t // 8 + 8 * q, None], (8,), (chunk,)))

    @cute.jit
    def _consume(
        self, mQ, mK, mIdx, mLen, mO, mLse, mSink, scale_log2, causal_off, window, qk_mma, pv_mma, pv_ss_mma,
        sQ, sK, sVt, sIdx, sMaskFlag, sX, sP, bars, wg, wtid,
    ):
        c = self.cfg
        n = c.n_block
        S = c.stages
        q_full, q_empty = bars + 4 * S, bars + 4 * S + 1
        s_q = cute.size(mQ, mode=[0])
        mrow = wg // c.n_dsplit
        dsplit = wg % c.n_dsplit
        sQ_wg = cute.local_tile(sQ, (64, c.d), (mrow, 0))
        sVt_wg = cute.local_tile(sVt, (c.dv_wg, n, S), (dsplit, 0, 0))
        thr_qk = qk_mma.get_slice(wtid)
        thr_pv = pv_mma.get_slice(wtid)
        tSrQ = qk_mma.make_fragment_A(thr_qk.partition_A(sQ_wg))
        tSrK = qk_mma.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(thr_pv.partition_B(sVt_wg))
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, n)), cutlass.Float32)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, c.dv_wg)), cutlass.Float32)
        rP = cute.make_rmem_tensor(acc_S.layout, mO.element_type)
        tOrP = _acc_as_operand_a(rP)
        S_mn = _mn_view(acc_S)
        P_mn = _mn_view(rP)
        O_mn = _mn_view(acc_O)
        cS_mn = _mn_view(thr_qk.partition_C(cute.make_identity_tensor((64, n))))
        cO_mn = _mn_view(thr_pv.partition_C(cute.make_identity_tensor((64, c.dv_wg))))
        n_r = cute.size(S_mn, mode=[0])
        n_kb = cute.size(tSrQ, mode=[2]) // c.n_dsplit  # QK k-blocks of this warpgroup's d slice (d split)
        record("Q operand fragments (tSrQ)", tSrQ)
        record("K operand fragments (tSrK)", tSrK)
        record("V^T operand fragments (tOrV)", tOrV)
        record("S accumulator (acc_S)", acc_S)
        record("S as (rows, cols) of this thread (acc_S_mn)", S_mn)
        record("O accumulator (acc_O)", acc_O)
        record("P as PV operand A (tOrP)", tOrP)

        # per-row state: running max (log2 domain), this thread's partial row sum, query token
        row_max = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_tok = cute.make_rmem_tensor((n_r,), cutlass.Int32)

        # both GEMMs accumulate (acc_S is zeroed per tile): the MMA state is set once, outside
        # the staged loops, so no loop region owns it
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        if cutlass.const_expr(c.key_split):
            pv_ss_mma.set(warpgroup.Field.ACCUMULATE, True)
            tOsP = pv_ss_mma.make_fragment_A(pv_ss_mma.get_slice(wtid).partition_A(sP))
            store_P = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), rP.element_type),
                qk_mma,
            ).get_slice(wtid)
            tPsP = store_P.partition_D(sP)
            record("partner's P operand fragments (tOsP)", tOsP)
            record("P registers -> smem (stmatrix) destination (tPsP)", tPsP)
        if cutlass.const_expr(c.n_dsplit == 1):  # the ping-pong, persistent or not (v7b hung without this)
            if wg == 1:
                cute.arch.barrier_arrive(barrier_id=BAR_TURN0, number_of_threads=256)  # warpgroup 0 goes first
        base = cutlass.Int32(0)  # key tiles of the earlier items (the producer counts alike)
        for w in cutlass.range(self._items_of_cta(mIdx, mK, mQ), unroll=1):
            _, bidx, kvh, head0, _, n_tiles, tok0 = self._item(w, mIdx, mK, mQ, mLen)
            acc_O.fill(0.0)
            row_max.fill(MAX_INIT if c.key_split else -cutlass.Float32.inf)
            row_sum.fill(0.0)
            for r in cutlass.range_constexpr(n_r):
                row_tok[r] = tok0 + (mrow * 64 + cS_mn[r, 0][0]) // c.hb
            cute.arch.mbarrier_wait(q_full, w & 1)
            if cutlass.const_expr(c.tma_kv):  # Q came by cp.async; the K/V waits fence only gathered tiles
                cute.arch.fence_proxy("async.shared", space="cta")
            if cutlass.const_expr(c.key_split):
                args = (qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP, S_mn,
                        P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                        causal_off, window, (n_tiles + 1) // 2)
                if wg == 0:
                    self._pairs_wg0(*args)
                else:
                    self._pairs_wg1(*args)
                self._merge_row_sums(row_sum, sX, wg, wtid)
            else:
                args = (qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max,
                        row_sum, row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb)
                if cutlass.const_expr(c.n_dsplit == 1):
                    self._pingpong(*args, wg, base, q_empty)
                else:
                    self._split_d(*args, sX, dsplit, wtid)
            self._epilogue(mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit, wtid, tok0, head0,
                           kvh, s_q, bidx)
            base = base + n_tiles
        if cutlass.const_expr(c.n_dsplit == 1):
            if wg == 0:
                cute.arch.barrier(barrier_id=BAR_TURN0, number_of_threads=256)  # pairs warpgroup 1's last arrive

    @cute.jit
    def _pingpong(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                  row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, wg, base, q_empty):
        """d <= 256, two warpgroups of 64 rows each (FA3's schedule, written for this kernel): a
        warpgroup issues S(kt) = Q K^T and O += P(kt-1) V(kt-1) back to back while it holds the
        turn, hands the turn over and runs the softmax of S(kt) while the partner's GEMMs use the
        tensor cores. The turn (named barriers BAR_TURN0 + w) keeps the two out of phase; left
        free they fall into step, because both wait for the same smem stages. The turns run on across
        the CTA's work items (warpgroup 1 opens the first, warpgroup 0 closes the last, `_consume`):
        warpgroup 0 starts the next item's S while warpgroup 1 finishes the current one. Tile kt of
        the item is the CTA's tile base + kt; q_empty is signalled once the item's last S is done."""
        softmax_args = (S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window)
        corr = cute.make_rmem_tensor((cute.size(S_mn, mode=[0]),), cutlass.Float32)
        mine, other = BAR_TURN0 + wg, BAR_TURN0 + 1 - wg
        S = self.cfg.stages
        self._wait_k(bars, base)
        acc_S.fill(0.0)
        cute.arch.barrier(barrier_id=mine, number_of_threads=256)
        self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, base % S, 0, n_kb)
        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
        warpgroup.wait_group(0)
        self._softmax_scores(*softmax_args, corr, base % S)
        self._release_k(bars, base)
        self._rescale_o_cast_p(O_mn, corr, acc_S, rP)
        for kt in cutlass.range(base + 1, base + n_tiles, unroll=1):
            self._wait_k(bars, kt)  # the waits and the zeroing stay outside the turn: it is only
            self._wait_v(bars, kt - 1)  # held while the GEMMs are issued
            acc_S.fill(0.0)
            cute.arch.barrier(barrier_id=mine, number_of_threads=256)
            self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, kt % S, 0, n_kb)
            self._pv(pv_mma, acc_O, tOrP, tOrV, (kt - 1) % S, True)
            cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
            warpgroup.wait_group(1)  # S(kt); PV(kt-1) still runs
            self._softmax_scores(*softmax_args, corr, kt % S)
            self._release_k(bars, kt)
            self._wait_pv_rescale_o(O_mn, corr)  # PV(kt-1): P and O are free
            self._release_v(bars, kt - 1)
            rP.store(acc_S.load().to(rP.element_type))
        cute.arch.mbarrier_arrive(q_empty)  # every S of the item is done: sQ may take the next Q
        last = base + n_tiles - 1
        self._wait_v(bars, last)
        cute.arch.barrier(barrier_id=mine, number_of_threads=256)
        self._pv(pv_mma, acc_O, tOrP, tOrV, last % S, True)
        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=256)
        warpgroup.wait_group(0)
        self._release_v(bars, last)

    @cute.jit
    def _split_d(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                 row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, sX, dsplit, wtid):
        """dv = 512 with V != K: each warpgroup computes S over its half of d, the two add their
        partials through smem (bitwise the same S in both), then each multiplies P into its half of O."""
        softmax_args = (S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window)
        corr = cute.make_rmem_tensor((cute.size(S_mn, mode=[0]),), cutlass.Float32)
        S = self.cfg.stages
        for kt in cutlass.range(n_tiles, unroll=1):
            self._wait_k(bars, kt)
            acc_S.fill(0.0)
            self._issue_qk(qk_mma, acc_S, tSrQ, tSrK, kt % S, dsplit, n_kb)
            warpgroup.wait_group(0)
            self._exchange_partial_s(acc_S, sX, dsplit, wtid)
            self._softmax_scores(*softmax_args, corr, kt % S)
            self._release_k(bars, kt)
            self._rescale_o_cast_p(O_mn, corr, acc_S, rP)
            self._wait_v(bars, kt)
            self._pv(pv_mma, acc_O, tOrP, tOrV, kt % S, True)
            warpgroup.wait_group(0)
            self._release_v(bars, kt)

    @cute.jit
    def _wait_k(self, bars, kt):
        S = self.cfg.stages
        cute.arch.mbarrier_wait(bars + kt % S, (kt // S) & 1)
        if cutlass.const_expr(not self.cfg.tma_kv):  # TMA writes are the async proxy's already
            cute.arch.fence_proxy("async.shared", space="cta")  # cp.async writes -> wgmma reads

    @cute.jit
    def _wait_v(self, bars, kt):
        """V of tile kt is in smem (when V is K, its K wait covered it)."""
        S = self.cfg.stages
        if cutlass.const_expr(not self.cfg.kv_shared):
            cute.arch.mbarrier_wait(bars + 2 * S + kt % S, (kt // S) & 1)
            if cutlass.const_expr(not self.cfg.tma_kv):
                cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def _release_k(self, bars, kt):
        """The mask has read tile kt's indices and QK its K rows; when V is K, PV still needs them."""
        if cutlass.const_expr(not self.cfg.kv_shared):
            cute.arch.mbarrier_arrive(bars + self.cfg.stages + kt % self.cfg.stages)

    @cute.jit
    def _release_v(self, bars, kt):
        S = self.cfg.stages
        cute.arch.mbarrier_arrive(bars + (S if self.cfg.kv_shared else 3 * S) + kt % S)

    @cute.jit
    def _softmax_scores(self, S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window,
                        corr, stage):
        """S -> exp2(S * scale - m) in place (fp32) with m the new running row max (log2 domain);
        this thread's row sums updated; corr[r] = the factor O must be scaled by, which the caller
        applies once the previous PV has left O. The mask runs only on tiles the producer flagged."""
        n_r, n_c = cute.size(S_mn, mode=[0]), cute.size(S_mn, mode=[1])
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window)
        for r in cutlass.range_constexpr(n_r):
            m_new = cute.arch.fmax(row_max[r], _row_max(S_mn, r) * scale_log2)
            m_base = m_new
            if m_new == -cutlass.Float32.inf:  # a fully masked row so far: keep exp2 away from NaN
                m_base = cutlass.Float32(0.0)
            corr[r] = cute.arch.exp2(row_max[r] - m_base)
            row_max[r] = m_new
            sums = [cutlass.Float32(0.0)] * 4
            for cc in cutlass.range_constexpr(n_c):
                p = self._exp2(S_mn[r, cc] * scale_log2 - m_base, cc)
                S_mn[r, cc] = p
                sums[cc % 4] = sums[cc % 4] + p
            row_sum[r] = row_sum[r] * corr[r] + ((sums[0] + sums[1]) + (sums[2] + sums[3]))

    @cute.jit
    def _exp2(self, x, cc: cutlass.Constexpr):
        """exp2 of a score in column cc of this thread's tile (the MUFU's)."""
        return cute.arch.exp2(x)

    @cute.jit
    def _rescale_o_cast_p(self, O_mn, corr, acc_S, rP):
        if _any_moved(corr):
            _scale_rows(O_mn, corr)
        rP.store(acc_S.load().to(rP.element_type))

    @cute.jit
    def _wait_pv_rescale_o(self, O_mn, corr):
        """Wait for the queued PV (it reads P, accumulates O), then O *= corr where a row max moved.
        The wait sits in both arms of the vote's branch on purpose: in one straight-line block with
        the softmax, ptxas scheduled the wgmma wait above the exponentials (they touch neither P
        nor O), so the softmax ran after PV(kt-1) instead of under it (docs/lessons/fmha.md, 25)."""
        if _any_moved(corr):
            warpgroup.wait_group(0)
            _scale_rows(O_mn, corr)
        else:
            warpgroup.wait_group(0)

    @cute.jit
    def _key_ok(self, key, t_first, t_last, causal_off, window):
        """Whether key is valid and inside the positional mask of every query token in
        [t_first, t_last] (one row: t_first == t_last)."""
        c = self.cfg
        ok = key >= 0
        if cutlass.const_expr(not c.per_token_idx):
            ok = ok & (key > t_last + causal_off - window)
            if cutlass.const_expr(c.causal):
                ok = ok & (key <= t_first + causal_off)
            else:
                ok = ok & (key < t_first + causal_off + window)
        return ok

    @cute.jit
    def _mask_tile(self, S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window):
        """S = -inf where the key is invalid (-1) or outside the positional mask of the row's query
        token; skipped (one warp-uniform branch) when every producer warp of the tile found all its
        keys inside every row's mask: a full top-k list, or a tile away from the causal diagonal."""
        flag_warps = 2 if self.cfg.key_split else 4  # producer warps per tile
        plain = sMaskFlag[0, stage]
        for w in cutlass.range_constexpr(1, flag_warps):
            plain = plain + sMaskFlag[w, stage]
        if plain < flag_warps:
            for r in cutlass.range_constexpr(cute.size(S_mn, mode=[0])):
                for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    if not self._key_ok(sIdx[cS_mn[r, cc][1], stage], row_tok[r], row_tok[r], causal_off, window):
                        S_mn[r, cc] = -cutlass.Float32.inf

    @cute.jit
    def _issue_qk(self, qk_mma, acc_S, tSrQ, tSrK, stage, dsplit, n_kb: int):
        """Queue S += Q K^T of the tile in `stage` over this warpgroup's slice of d (no wait)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(n_kb):
            k = dsplit * n_kb + kb
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_S)
        warpgroup.commit_group()

    # ---------------- key split (dv = 512, V = K): warpgroup w owns tile 2p + w of pair p ----------------
    # Per pair, WG0 and WG1 each compute S over the full d for their own tile, agree on the row max
    # through smem (WG0 publishes max(old, own), WG1 folds in its own and publishes the final one),
    # multiply their own P from registers and the partner's P from smem into their half of O.
    # Named-barrier roles per pair: MAX0 WG0 -> WG1, MAX1 WG1 -> WG0, P0 WG0 -> WG1, P1 WG1 -> WG0; a
    # warpgroup reaches a barrier of pair p + 1 only after the partner passed it in pair p.

    @cute.jit
    def _qk_half(self, qk_mma, acc_S, tSrQ, tSrK, bars, stage: int, h: int, phase, zero: bool):
        """Wait for half h of d of the tile in `stage`, queue its k-blocks of S = Q K^T (no commit)."""
        n_kb = cute.size(tSrQ, mode=[2]) // 2
        cute.arch.mbarrier_wait(bars + stage * 2 + h, phase)
        cute.arch.fence_proxy("async.shared", space="cta")  # cp.async writes -> wgmma reads
        if cutlass.const_expr(zero):
            acc_S.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(n_kb):
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, h * n_kb + kb], tSrK[None, None, h * n_kb + kb, stage], acc_S)

    @cute.jit
    def _softmax_tile(self, S_mn, P_mn, corr, cS_mn, row_max, row_sum, sM, wtid, r: int, m_new, scale_log2):
        """Row r with the new running max: P = exp2(S * scale - m_new) (fp32 kept in S, bf16 in P), rescale
        the row's partial sum, corr[r] = O's factor (the caller applies it), publish m_new (one lane
        of the quad)."""
        corr[r] = cute.arch.exp2(row_max[r] - m_new)
        row_max[r] = m_new
        acc = cutlass.Float32(0.0)
        for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
            pv = self._exp2(S_mn[r, cc] * scale_log2 - m_new, cc)
            S_mn[r, cc] = pv
            acc += pv
            P_mn[r, cc] = pv.to(P_mn.element_type)
        row_sum[r] = row_sum[r] * corr[r] + acc
        if wtid % 4 == 0:
            sM[cS_mn[r, 0][0]] = m_new

    @cute.jit
    def _pv(self, mma, acc_O, tA, tOrV, stage: int, a_in_registers: bool):
        if cutlass.const_expr(a_in_registers):
            _fence_operand(tA)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            cute.gemm(mma, acc_O, tA[None, None, kb], tOrV[None, None, kb, stage], acc_O)
        warpgroup.commit_group()

    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 0: tiles 2p in stage 0, O[:, :256]; frees 0-left and 1-left. The last pair is
        peeled off: a wgmma under a runtime branch (queue the next S or not) makes ptxas serialize
        every wgmma of the kernel (C7520, docs/lessons/fmha.md)."""
        args = (qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP, S_mn, P_mn,
                O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2, causal_off, window)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, 0, True)
        self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, 0, False)
        warpgroup.commit_group()
        for pair in cutlass.range(n_pairs - 1, unroll=1):
            self._wg0_pair(*args, pair, False)
        self._wg0_pair(*args, n_pairs - 1, True)

    @cute.jit
    def _wg0_pair(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                  S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                  causal_off, window, pair, last: cutlass.Constexpr):
        empty = bars + 4
        n_r = cute.size(S_mn, mode=[0])
        warpgroup.wait_group(0)  # S of this pair's tile 2p
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, 0, row_tok, causal_off, window)
        for r in cutlass.range_constexpr(n_r):  # the scale is positive: it commutes with the max
            mx = _row_max(S_mn, r) * scale_log2
            self._softmax_tile(S_mn, P_mn, corr, cS_mn, row_max, row_sum, sX, wtid, r, cute.arch.fmax(row_max[r], mx),
                               scale_log2)
        cute.arch.barrier_arrive(barrier_id=BAR_MAX0, number_of_threads=256)  # the max is out; O is private
        if _any_moved(corr):
            _scale_rows(O_mn, corr)
        self._pv(pv_mma, acc_O, tOrP, tOrV, 0, True)
        warpgroup.wait_group(0)
        cute.arch.mbarrier_arrive(empty + 0)  # 0-left: its last reader was this PV
        cute.arch.barrier(barrier_id=BAR_MAX1, number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):  # move P, O and the sum onto WG1's final max
            final = sX[cS_mn[r, 0][0]]
            corr[r] = cute.arch.exp2(row_max[r] - final)
            row_max[r] = final
            row_sum[r] = row_sum[r] * corr[r]
            for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                P_mn[r, cc] = (S_mn[r, cc] * corr[r]).to(P_mn.element_type)
        _scale_rows(O_mn, corr)  # unguarded: with the vote here ptxas spilled 4 B
        cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, 0])
        cute.arch.fence_proxy("async.shared", space="cta")  # st.shared -> the partner's wgmma
        cute.arch.barrier_arrive(barrier_id=BAR_P0, number_of_threads=256)
        cute.arch.barrier(barrier_id=BAR_P1, number_of_threads=256)
        self._pv(pv_ss_mma, acc_O, tOsP[None, None, None, 1], tOrV, 1, False)
        if cutlass.const_expr(last):
            warpgroup.wait_group(0)
            cute.arch.mbarrier_arrive(empty + 2)  # 1-left
        else:  # queue the next tile's S behind it
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 0, (pair + 1) & 1, True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            cute.arch.mbarrier_arrive(empty + 2)
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 0, 1, (pair + 1) & 1, False)
            warpgroup.commit_group()

    @cute.jit
    def _pairs_wg1(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        """Warpgroup 1: tiles 2p + 1 in stage 1, O[:, 256:]; frees 1-right and 0-right."""
        empty = bars + 4
        n_r = cute.size(S_mn, mode=[0])
        tile_max = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        corr = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        for pair in cutlass.range(n_pairs, unroll=1):
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 1, pair & 1, True)
            self._qk_half(qk_mma, acc_S, tSrQ, tSrK, bars, 1, 0, pair & 1, False)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self._mask_tile(S_mn, cS_mn, sIdx, sMaskFlag, 1, row_tok, causal_off, window)
            for r in cutlass.range_constexpr(n_r):
                tile_max[r] = _row_max(S_mn, r) * scale_log2
            cute.arch.barrier(barrier_id=BAR_MAX0, number_of_threads=256)
            for r in cutlass.range_constexpr(n_r):  # WG0's max already includes the old running max
                self._softmax_tile(S_mn, P_mn, corr, cS_mn, row_max, row_sum, sX, wtid, r,
                                   cute.arch.fmax(sX[cS_mn[r, 0][0]], tile_max[r]), scale_log2)
            cute.arch.barrier_arrive(barrier_id=BAR_MAX1, number_of_threads=256)
            if _any_moved(corr):
                _scale_rows(O_mn, corr)
            self._pv(pv_mma, acc_O, tOrP, tOrV, 1, True)
            cute.copy(store_P, store_P.retile(rP), tPsP[None, None, None, 1])
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BAR_P0, number_of_threads=256)
            self._pv(pv_ss_mma, acc_O, tOsP[None, None, None, 0], tOrV, 0, False)
            cute.arch.barrier_arrive(barrier_id=BAR_P1, number_of_threads=256)
            warpgroup.wait_group(1)
            cute.arch.mbarrier_arrive(empty + 3)  # 1-right
            warpgroup.wait_group(0)
            cute.arch.mbarrier_arrive(empty + 1)  # 0-right

    @cute.jit
    def _merge_row_sums(self, row_sum, sX, wg, wtid):
        """Key split: each warpgroup summed P over its own tiles. The partner's thread wtid holds
        the same rows, so one swap through smem gives both the full per-thread sum (a + b == b + a:
        both warpgroups end bitwise equal)."""
        n_r = cute.size(row_sum)
        for r in cutlass.range_constexpr(n_r):
            sX[64 + (wg * 128 + wtid) * n_r + r] = row_sum[r]
        cute.arch.barrier(barrier_id=BAR_SUMS, number_of_threads=256)
        for r in cutlass.range_constexpr(n_r):
            row_sum[r] = row_sum[r] + sX[64 + ((1 - wg) * 128 + wtid) * n_r + r]

    @cute.jit
    def _exchange_partial_s(self, acc_S, sX, dsplit, wtid):
        """S = S_0 + S_1 in both warpgroups of a d split, through one smem buffer (sX[thread + 128 i],
        thread-major so the 128 lanes hit distinct banks). WG1 publishes S_1; WG0 adds it, then
        publishes S_0; WG1 adds that. Both sum in the order S_0 + S_1: bitwise the same S."""
        nv = cute.size(acc_S)
        if dsplit == 1:
            for i in cutlass.range_constexpr(nv):
                sX[wtid + 128 * i] = acc_S[i]
            cute.arch.barrier_arrive(barrier_id=BAR_XCHG_S1, number_of_threads=256)
            cute.arch.barrier(barrier_id=BAR_XCHG_S0, number_of_threads=256)
            for i in cutlass.range_constexpr(nv):
                acc_S[i] = sX[wtid + 128 * i] + acc_S[i]
        else:
            cute.arch.barrier(barrier_id=BAR_XCHG_S1, number_of_threads=256)
            for i in cutlass.range_constexpr(nv):
                other = sX[wtid + 128 * i]
                sX[wtid + 128 * i] = acc_S[i]
                acc_S[i] = acc_S[i] + other
            cute.arch.barrier_arrive(barrier_id=BAR_XCHG_S0, number_of_threads=256)

    @cute.jit
    def _epilogue(self, mO, mLse, mSink, sQ, O_mn, cO_mn, row_max, row_sum, mrow, dsplit, wtid, tok0, head0,
                  kvh, s_q, bidx):
        """Normalise (sink in the denominator) and store O: staged in smem (the Q buffer) and written
        as 16-byte rows, or, persistent, straight from registers as column pairs (the Q buffer is
        already taking the next item's Q; O is a small part of the traffic of d <= 256)."""
        c = self.cfg
        n_consumers = 128 * c.n_consumer_wg
        if cutlass.const_expr(not c.persistent):
            cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=n_consumers)  # all QK reads of sQ done
        pair = cute.make_rmem_tensor((2,), mO.element_type)
        for r in cutlass.range_constexpr(cute.size(O_mn, mode=[0])):
            r_cta = mrow * 64 + cO_mn[r, 0][0]
            t = tok0 + r_cta // c.hb
            head = head0 + r_cta % c.hb
            ok = (t < s_q) & (head - kvh * c.hpg < c.hpg) & (r_cta < c.hb * c.tq)
            tot = _quad_allreduce(row_sum[r], lambda a, b: a + b)
            m = row_max[r]
            m_base = m
            if m == -cutlass.Float32.inf:
                m_base = cutlass.Float32(0.0)
            # the sink: a virtual key in the denominator only (-inf = no sink)
            den = tot + cute.arch.exp2(mSink[head if ok else 0] * LOG2E - m_base)
            inv = cutlass.Float32(0.0)
            if den > 0.0:
                inv = 1.0 / den
            if cutlass.const_expr(c.persistent):
                if ok:  # columns cc, cc + 1 of the accumulator are adjacent columns of O
                    for cc in cutlass.range_constexpr(0, cute.size(O_mn, mode=[1]), 2):
                        pair[0] = (O_mn[r, cc] * inv).to(mO.element_type)
                        pair[1] = (O_mn[r, cc + 1] * inv).to(mO.element_type)
                        cute.autovec_copy(pair, cute.local_tile(mO[t, head, None, bidx], (2,), (cO_mn[r, cc][1] // 2,)))
            else:
                for cc in cutlass.range(cute.size(O_mn, mode=[1]), unroll_full=True):
                    sQ[r_cta, dsplit * c.dv_wg + cO_mn[r, cc][1]] = (O_mn[r, cc] * inv).to(mO.element_type)
            if ok & (dsplit == 0) & (cO_mn[r, 0][1] == 0):
                lse = -cutlass.Float32.inf
                if tot > 0.0:
                    lse = (m_base + cute.math.log2(tot, fastmath=False)) * LN2
                mLse[t, head, bidx] = lse
        if cutlass.const_expr(not c.persistent):
            cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=n_consumers)
            tid = mrow * 128 * c.n_dsplit + dsplit * 128 + wtid
            cpr = c.dv // 8
            rpp = n_consumers // cpr
            chunk = tid % cpr
            frag = cute.make_rmem_tensor((8,), mO.element_type)
            for p in cutlass.range(c.m_cta // rpp, unroll_full=True):
                r = p * rpp + tid // cpr
                t = tok0 + r // c.hb
                head = head0 + r % c.hb
                if (t < s_q) & (head - kvh * c.hpg < c.hpg) & (r < c.hb * c.tq):
                    cute.autovec_copy(cute.local_tile(sQ[r, None], (8,), (chunk,)), frag)
                    cute.autovec_copy(frag, cute.local_tile(mO[t, head, None, bidx], (8,), (chunk,)))
