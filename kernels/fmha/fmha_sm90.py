"""Gathered-key attention for Hopper (SM90) in CuTeDSL: head_dim up to 512, sink, masks, LSE.

One formulation covers DSV4 sparse attention (CSA top-k + window, HCA, SWA-only) and the general
dense FMHA sweep: each CTA owns a block of query rows and walks a list of key indices
`idx[block, :]` (-1 = invalid) in tiles of `n_block` keys. Dense causal / sliding-window masks are
the same list (the block's key range) plus a positional mask evaluated in registers.

CTA geometry (rows of the M tile = (query token, head) pairs, heads fastest):
  * `hb` heads of one kv group times `tq` query tokens fill the M tile (64 or 128 rows). MQA / GQA
    decode packs all heads of a token into M; per-token index lists force tq = 1.
  * Warpgroups: `n_mrow` row blocks of 64 x `n_dsplit` slices of the value dim. At dv = 512 the
    PV accumulator (64 x 512 fp32 = 256 registers/thread) does not fit one warpgroup, so two
    warpgroups each own a 256-wide slice of O; both compute the same S = Q K^T.
  * Keys: all threads gather the next tile's kv rows with 16-byte cp.async into a swizzled smem
    stage (double buffered) while the warpgroups run QK wgmma -> masked online softmax (exp2,
    fp32) -> PV wgmma (P from registers, V from smem read MN-major). When K is V (the DSV4 latent)
    one smem tile serves both GEMMs: V^T is a transposed view of the K tile.
  * Epilogue: O /= (row_sum + exp(sink - row_max)), bf16 to global; natural-log LSE (sink-free).

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

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SMEM_BUDGET = 200 * 1024  # bytes this kernel may use (H100: 227 KiB per CTA)


@dataclass(frozen=True)
class Config:
    """Everything that changes the compiled code."""

    d: int  # q/k head dim
    dv: int  # v / output head dim
    hpg: int  # query heads per kv head
    kv_shared: bool  # V is K (MQA latent): one smem tile for both GEMMs
    per_token_idx: bool  # indices are per query token (sparse); else per query block + positional mask
    causal: bool = False  # positional causal mask (block lists only); the window is a runtime value

    def __post_init__(self) -> None:
        if self.d % 64 or not 64 <= self.d <= 512:
            raise ValueError(f"head_dim {self.d} unsupported (multiple of 64 in 64..512)")
        if self.dv % 64 or not 64 <= self.dv <= 512 or (self.dv > 256 and self.dv % 256):
            raise ValueError(f"value dim {self.dv} unsupported (64..256 step 64, or 512)")
        if self.kv_shared and self.d != self.dv:
            raise ValueError("kv_shared needs d == dv")

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
    def threads(self) -> int:
        return 128 * self.n_mrow * self.n_dsplit

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
    def stages(self) -> int:
        return 2

    def smem_bytes(self, n_block: int) -> int:
        kv_row = self.d + (0 if self.kv_shared else self.dv)
        return 2 * (self.m_cta * self.d + self.stages * n_block * kv_row) + 4 * self.stages * n_block

    @property
    def n_block(self) -> int:
        """Keys per tile: the largest that fits smem and keeps S + O in registers."""
        cap = 64 if self.dv_wg >= 256 else 128
        for n in (128, 64, 32):
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


def _quad_allreduce(x: cutlass.Float32, op) -> cutlass.Float32:
    """Reduce over the 4 threads of a quad that share an accumulator row."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return op(x, cute.arch.shuffle_sync_bfly(x, offset=2))


class GatherAttentionSm90:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.layouts: dict[str, str] = {}  # name -> traced layout, for `dsv4bench layouts`

    def _record(self, name: str, obj) -> None:
        self.layouts[name] = cute.pretty_str(obj) if not isinstance(obj, str) else obj

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (s_q, h_q, d, B) bf16
        mK: cute.Tensor,  # (s_kv, h_kv, d, B) bf16
        mV: cute.Tensor,  # (s_kv, h_kv, dv, B) bf16 (ignored when kv_shared)
        mIdx: cute.Tensor,  # (rows, n, B) int32: rows = s_q (per token) or query blocks
        mSink: cute.Tensor,  # (h_q,) fp32 logits; -inf where a head has no sink
        mO: cute.Tensor,  # (s_q, h_q, dv, B) bf16
        mLse: cute.Tensor,  # (s_q, h_q, B) fp32
        scale_log2: cutlass.Float32,  # softmax scale * log2(e)
        causal_off: cutlass.Int32,  # s_kv - s_q: query t is aligned to key t + off
        window: cutlass.Int32,  # block lists: window keys incl. the diagonal (huge = none)
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
        self._record("config", str(c) + f" n_block={n} threads={c.threads}")
        self._record("tiled_mma_qk", str(qk_mma))
        self._record("tiled_mma_pv", str(pv_mma))
        self._record("smem_q", sQ_layout)
        self._record("smem_k", sK_layout)
        self._record("smem_v", sV_layout)

        @cute.struct
        class Storage:
            sIdx: cute.struct.MemRange[cutlass.Int32, c.stages * n]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[
                cute.struct.MemRange[dt, 8 if c.kv_shared else cute.cosize(sV_layout)], 1024
            ]

        n_rows = cute.size(mIdx, mode=[0])
        grid = (n_rows, cute.size(mK, mode=[1]) * c.n_hblk, cute.size(mQ, mode=[3]))
        self.kernel(
            mQ, mK, mV, mIdx, mSink, mO, mLse, scale_log2, causal_off, window,
            qk_mma, pv_mma, sQ_layout, sK_layout, sV_layout, Storage,
        ).launch(grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.jit
    def _load_tile(self, kt, stage, atom_g2s, mIdx, mK, mV, sIdx, sK, sVt, blk, bidx, kvh, n_idx, s_kv):
        """Gather key tile kt (its kv rows and its indices) into smem stage `stage` (cp.async)."""
        c = self.cfg
        n = c.n_block
        tidx, _, _ = cute.arch.thread_idx()
        cpr = c.d // 8  # 16-byte chunks per row
        rpp = c.threads // cpr  # rows per pass
        chunk = tidx % cpr
        row_in_pass = tidx // cpr
        base = kt * n
        if tidx < n:
            j = base + tidx
            v = cutlass.Int32(-1)
            if j < n_idx:
                v = mIdx[blk, j, bidx]
            if v >= s_kv:
                v = cutlass.Int32(-1)
            sIdx[tidx, stage] = v
        for p in cutlass.range_constexpr(n // rpp):
            r = p * rpp + row_in_pass
            j = base + r
            v = cutlass.Int32(0)
            if j < n_idx:
                v = mIdx[blk, j, bidx]
            if (v < 0) | (v >= s_kv):
                v = cutlass.Int32(0)  # invalid keys read a real row; their P is exactly 0
            g = cute.local_tile(mK[v, kvh, None, bidx], (8,), (chunk,))
            s = cute.local_tile(sK[r, None, stage], (8,), (chunk,))
            cute.copy(atom_g2s, g, s)
        if cutlass.const_expr(not c.kv_shared):
            cpr_v = c.dv // 8
            rpp_v = c.threads // cpr_v
            chunk_v = tidx % cpr_v
            for p in cutlass.range_constexpr(n // rpp_v):
                r = p * rpp_v + tidx // cpr_v
                j = base + r
                v = cutlass.Int32(0)
                if j < n_idx:
                    v = mIdx[blk, j, bidx]
                if (v < 0) | (v >= s_kv):
                    v = cutlass.Int32(0)
                g = cute.local_tile(mV[v, kvh, None, bidx], (8,), (chunk_v,))
                s = cute.local_tile(sVt[None, r, stage], (8,), (chunk_v,))
                cute.copy(atom_g2s, g, s)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mIdx: cute.Tensor,
        mSink: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale_log2: cutlass.Float32,
        causal_off: cutlass.Int32,
        window: cutlass.Int32,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        Storage: cutlass.Constexpr,
    ):
        c = self.cfg
        n = c.n_block
        tidx, _, _ = cute.arch.thread_idx()
        blk, hblk_all, bidx = cute.arch.block_idx()
        kvh = hblk_all // c.n_hblk
        head0 = kvh * c.hpg + (hblk_all % c.n_hblk) * c.hb  # first query head of this CTA
        s_q = cute.size(mQ, mode=[0])
        s_kv = cute.size(mK, mode=[0])
        n_idx = cute.size(mIdx, mode=[1])
        tok0 = blk * c.tq

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        sIdx = st.sIdx.get_tensor(cute.make_layout((n, c.stages)))
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)[None, None, 0]
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        if cutlass.const_expr(c.kv_shared):
            # V^T (d, n, stage) is the K tile read MN-major: same bytes, modes swapped.
            sVt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        else:
            sVt = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        # ---------------- gather producer: every thread copies 16-byte chunks ----------------
        atom_g2s = cute.make_copy_atom(cpasync.CopyG2SOp(), mQ.element_type, num_bits_per_copy=128)
        cpr = c.d // 8  # 16-byte chunks per row
        rpp = c.threads // cpr  # rows per pass
        chunk = tidx % cpr
        row_in_pass = tidx // cpr

        # Q rows: row r -> (token tok0 + r // hb, head head0 + r % hb); out-of-range rows read row 0.
        for p in cutlass.range_constexpr(c.m_cta // rpp):
            r = p * rpp + row_in_pass
            tok = tok0 + r // c.hb
            hl = r % c.hb
            ok = (tok < s_q) & (hl + head0 - kvh * c.hpg < c.hpg) & (r < c.hb * c.tq)
            src_t = tok if ok else 0
            src_h = head0 + hl if ok else 0
            g = cute.local_tile(mQ[src_t, src_h, None, bidx], (8,), (chunk,))
            s = cute.local_tile(sQ[r, None], (8,), (chunk,))
            cute.copy(atom_g2s, g, s)

        # ---------------- consumer warpgroup setup ----------------
        wg = tidx // 128
        mrow = wg // c.n_dsplit
        dsplit = wg % c.n_dsplit
        wtid = tidx % 128
        sQ_wg = cute.local_tile(sQ, (64, c.d), (mrow, 0))
        sVt_wg = cute.local_tile(sVt, (c.dv_wg, n, c.stages), (dsplit, 0, 0))
        thr_qk = qk_mma.get_slice(wtid)
        thr_pv = pv_mma.get_slice(wtid)
        tSrQ = qk_mma.make_fragment_A(thr_qk.partition_A(sQ_wg))
        tSrK = qk_mma.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(thr_pv.partition_B(sVt_wg))
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, n)), cutlass.Float32)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, c.dv_wg)), cutlass.Float32)
        acc_O.fill(0.0)
        rP = cute.make_rmem_tensor(acc_S.layout, mQ.element_type)
        tOrP = _acc_as_operand_a(rP)
        S_mn = _mn_view(acc_S)
        P_mn = _mn_view(rP)
        O_mn = _mn_view(acc_O)
        cS_mn = _mn_view(thr_qk.partition_C(cute.make_identity_tensor((64, n))))
        cO_mn = _mn_view(thr_pv.partition_C(cute.make_identity_tensor((64, c.dv_wg))))
        n_r = cute.size(S_mn, mode=[0])
        self._record("tSrQ", tSrQ.layout)
        self._record("tSrK", tSrK.layout)
        self._record("tOrV", tOrV.layout)
        self._record("acc_S", acc_S.layout)
        self._record("acc_S_mn", S_mn.layout)
        self._record("acc_O", acc_O.layout)
        self._record("tOrP", tOrP.layout)

        # per-row state: running max (log2 domain) and this thread's partial row sum
        row_max = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((n_r,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        # the query token of each of this thread's rows (for positional masks)
        row_tok = cute.make_rmem_tensor((n_r,), cutlass.Int32)
        for r in cutlass.range_constexpr(n_r):
            row_tok[r] = tok0 + (mrow * 64 + cS_mn[r, 0][0]) // c.hb

        n_tiles = (n_idx + n - 1) // n
        self._load_tile(0, 0, atom_g2s, mIdx, mK, mV, sIdx, sK, sVt, blk, bidx, kvh, n_idx, s_kv)
        cute.arch.cp_async_commit_group()
        for kt in cutlass.range(n_tiles, unroll=1):
            stage = kt % c.stages
            if kt + 1 < n_tiles:
                self._load_tile(kt + 1, (kt + 1) % c.stages, atom_g2s, mIdx, mK, mV, sIdx, sK, sVt, blk, bidx, kvh, n_idx, s_kv)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()

            # S = Q K^T over the full head dim
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_S, tSrQ[None, None, kb], tSrK[None, None, kb, stage], acc_S)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            # mask + online softmax (log2 domain)
            for r in cutlass.range_constexpr(n_r):
                t = row_tok[r]
                mx = -cutlass.Float32.inf
                for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    key = sIdx[cS_mn[r, cc][1], stage]
                    ok = key >= 0
                    if cutlass.const_expr(not c.per_token_idx):
                        ok = ok & (key > t + causal_off - window)
                        if cutlass.const_expr(c.causal):
                            ok = ok & (key <= t + causal_off)
                        else:
                            ok = ok & (key < t + causal_off + window)
                    sv = S_mn[r, cc] * scale_log2
                    if not ok:
                        sv = -cutlass.Float32.inf
                    S_mn[r, cc] = sv
                    mx = cute.arch.fmax(mx, sv)
                mx = _quad_allreduce(mx, cute.arch.fmax)
                m_new = cute.arch.fmax(row_max[r], mx)
                m_base = m_new
                if m_new == -cutlass.Float32.inf:
                    m_base = cutlass.Float32(0.0)
                corr = cute.arch.exp2(row_max[r] - m_base)
                row_max[r] = m_new
                acc = cutlass.Float32(0.0)
                for cc in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    pv = cute.arch.exp2(S_mn[r, cc] - m_base)
                    acc += pv
                    P_mn[r, cc] = pv.to(mQ.element_type)
                row_sum[r] = row_sum[r] * corr + acc
                for cc in cutlass.range_constexpr(cute.size(O_mn, mode=[1])):
                    O_mn[r, cc] = O_mn[r, cc] * corr

            # O += P V (this warpgroup's value slice)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                pv_mma.set(warpgroup.Field.ACCUMULATE, True)
                cute.gemm(pv_mma, acc_O, tOrP[None, None, kb], tOrV[None, None, kb, stage], acc_O)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            cute.arch.barrier()
        cute.arch.cp_async_wait_group(0)

        # ---------------- epilogue: normalise with the sink, store O and LSE ----------------
        for r in cutlass.range_constexpr(n_r):
            r_cta = mrow * 64 + cO_mn[r, 0][0]
            t = tok0 + r_cta // c.hb
            hl = r_cta % c.hb
            head = head0 + hl
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
            if ok:
                for cc in cutlass.range_constexpr(cute.size(O_mn, mode=[1])):
                    col = dsplit * c.dv_wg + cO_mn[r, cc][1]
                    mO[t, head, col, bidx] = (O_mn[r, cc] * inv).to(mO.element_type)
                if dsplit == 0:
                    if cO_mn[r, 0][1] == 0:
                        lse = -cutlass.Float32.inf
                        if tot > 0.0:
                            lse = (m_base + cute.math.log2(tot, fastmath=False)) * LN2
                        mLse[t, head, bidx] = lse
