"""Declared knock-out variants of the SM90 attention kernel (the default, v11: prefill_v11.py over kernel_sm90.py): where its time goes,
run through the harness beside the shipped kernel, on the same inputs, in one process:

    dsv4bench sweep fmha --hd 128,512 --impl cutedsl,cutedsl:no-gather,cutedsl:no-softmax,\\
        cutedsl:no-math,cutedsl:no-mufu,cutedsl:empty-grid --bench

Each is the kernel with one part replaced at its seam (a small method of the mixin that owns the
part); the outputs are garbage, so every variant declares `checked = False` (run and timed, never
compared):
    cutedsl:no-gather   the producer publishes the indices and arrives, but loads no kv rows: no
                        cp.async gather (`_copy_kv`, `_copy_half_rows`) and no TMA box (`_tma_load`:
                        a plain arrive where the box's arrive.expect_tx was), producer.py
    cutedsl:no-softmax  the MMAs and every barrier run; the mask and the exponentials do not, O's
                        rescale factor is 1 (`_mask_tile`, `_softmax_scores`: softmax.py;
                        `_softmax_tile`: key_split.py)
    cutedsl:no-math     the consumers only wait for each tile and free it: no MMA, no softmax
                        (`_pingpong`, `_split_d`, `_pairs_wg0` / `_pairs_wg1`: the schedules)
    cutedsl:no-mufu     the softmax's exp2 is one FMA (`_exp2`): what the MUFU's share costs
    cutedsl:empty-grid  an empty kernel of the same grid and block (the launch floor, kernels/probes.py)

Reading: if no-gather is about as fast as the kernel, the math is the bound; if no-math is, the
loads are; the kernel minus no-softmax is the softmax left exposed (docs/perf/fmha.md).
Registered by kernels/fmha/family.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from kernels.common import sm_count
from kernels.fmha.decode_pair import FusedQTma
from kernels.fmha.glue import FmhaCuteDSL, config_for
from kernels.fmha.kernel_sm90 import GatherAttentionSm90
from kernels.fmha.prefill_v11 import V11, V12, EpiTma, GatherHint, QFirst, SpinWait
from kernels.probes import EmptyGridMixin


class NoGather(V12):
    @cute.jit
    def _copy_kv(self, atom, sIdx, mT, dst, seg0: int, n_segs: int, ptid, stage, kvh, bidx):
        pass

    @cute.jit
    def _copy_half_rows(self, atom, mK, dst, rows, t, h: int, kvh, bidx):
        pass

    @cute.jit
    def _tma_load(self, atom, coords, offset, tile: tuple, dst, stage, bar):
        if cute.arch.lane_idx() == 0:  # the arrival of the box's arrive.expect_tx, with no bytes to expect
            cute.arch.mbarrier_arrive(bar)


class NoSoftmax(V12):
    @cute.jit
    def _mask_tile(self, S_mn, cS_mn, sIdx, sMaskFlag, stage, row_tok, causal_off, window):
        pass

    @cute.jit
    def _softmax_tile(self, S_mn, P_mn, corr, cS_mn, row_max, row_sum, sM, wtid, r: int, m_new, scale_log2):
        corr[r] = cutlass.Float32(1.0)

    @cute.jit
    def _softmax_scores(self, S_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, scale_log2, causal_off, window,
                        corr, stage):
        corr.fill(1.0)


class PairsHandOff:
    """Mixin: the key split's two schedules reduced to their stage hand-off (wait for each half, free it)."""

    @cute.jit
    def _pairs_wg0(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        for pair in cutlass.range(n_pairs, unroll=1):  # full[stage, half] = bars + 2 stage + half, empty = + 4
            for hb in cutlass.range_constexpr(2):
                cute.arch.mbarrier_wait(bars + hb, pair & 1)
            self._release(bars + 4 + 0)  # 0-left
            cute.arch.mbarrier_wait(bars + 2, pair & 1)
            self._release(bars + 4 + 2)  # 1-left

    @cute.jit
    def _pairs_wg1(self, qk_mma, pv_mma, pv_ss_mma, store_P, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, tOsP, tPsP, rP,
                   S_mn, P_mn, O_mn, cS_mn, row_max, row_sum, row_tok, sIdx, sMaskFlag, sX, bars, wtid, scale_log2,
                   causal_off, window, n_pairs):
        for pair in cutlass.range(n_pairs, unroll=1):
            for hb in cutlass.range_constexpr(2):
                cute.arch.mbarrier_wait(bars + 3 - hb, pair & 1)
            self._release(bars + 4 + 3)  # 1-right
            cute.arch.mbarrier_wait(bars + 1, pair & 1)
            self._release(bars + 4 + 1)  # 0-right


class NoMath(PairsHandOff, V12):
    """Each schedule reduced to its stage hand-off: wait for every tile, free it."""

    @cute.jit
    def _pingpong(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                  row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, wg, base, q_empty):
        for kt in cutlass.range(base, base + n_tiles, unroll=1):
            self._wait_k(bars, kt)
            self._release_k(bars, kt)
            self._wait_v(bars, kt)
            self._release_v(bars, kt)
        cute.arch.mbarrier_arrive(q_empty)

    @cute.jit
    def _split_d(self, qk_mma, pv_mma, acc_S, acc_O, tSrQ, tSrK, tOrP, tOrV, rP, S_mn, O_mn, cS_mn, row_max, row_sum,
                 row_tok, sIdx, sMaskFlag, bars, scale_log2, causal_off, window, n_tiles, n_kb: int, sX, dsplit, wtid):
        for kt in cutlass.range(n_tiles, unroll=1):
            self._wait_k(bars, kt)
            self._release_k(bars, kt)
            self._wait_v(bars, kt)
            self._release_v(bars, kt)


class NoMufu(V12):
    @cute.jit
    def _exp2(self, x, cc: cutlass.Constexpr):
        return x * cutlass.Float32(0.5) + cutlass.Float32(1.0)


class AttentionOnly(FmhaCuteDSL):
    """A variant of the attention kernel (`kernel_class` compiled in its place): attention cases only."""

    refusal = "a variant of the attention kernel: op attention only"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case.get("op", "attention") != "attention":
            return self.refusal
        return super().supports(case, arch)


class FmhaVariant(AttentionOnly):
    """A knock-out: `kernel_class` (the kernel with one part overridden) compiled in its place."""

    checked = False
    refusal = "knock-outs of the attention kernel only"


class FmhaNoGather(FmhaVariant):
    name, variant, kernel_class = "cutedsl:no-gather", "no-gather", NoGather


class FmhaNoSoftmax(FmhaVariant):
    name, variant, kernel_class = "cutedsl:no-softmax", "no-softmax", NoSoftmax


class FmhaNoMath(FmhaVariant):
    name, variant, kernel_class = "cutedsl:no-math", "no-math", NoMath


class FmhaNoMufu(FmhaVariant):
    name, variant, kernel_class = "cutedsl:no-mufu", "no-mufu", NoMufu


class FmhaEmptyGrid(EmptyGridMixin, FmhaVariant):
    name, variant = "cutedsl:empty-grid", "empty-grid"

    def launch_shape(self, case: Case):
        cfg = config_for(case)
        rows = case["s_q"] if cfg.per_token_idx else -(-case["s_q"] // cfg.tq)  # rows of the index list
        grid = (rows, case["h_kv"] * cfg.n_hblk, case["b"])
        if cfg.persistent and torch.cuda.is_available():  # the grid is a run-time value: CPU compiles skip it
            grid = (min(grid[0] * grid[1] * grid[2], self.persistent_ctas or sm_count(torch.device("cuda"))), 1, 1)
        return grid, cfg.threads


VARIANTS = (FmhaNoGather, FmhaNoSoftmax, FmhaNoMath, FmhaNoMufu, FmhaEmptyGrid)


class FmhaPrefillForm(AttentionOnly):
    """v10, the attention kernel before v11 (GatherAttentionSm90: Q by cp.async, O by scalar shared
    stores, the plain gather), and v10 with one of v11's three changes (kernels/fmha/prefill_v11.py):
    the A/B of each change against the default (v11, all three) and FlashMLA, on the same inputs. Real
    answers, checked against the oracle; they take every attention case (each is v10's code where v11's
    preconditions fail):

        dsv4bench sweep fmha --hd 512 --mask topk --op attention --bench \\
            --impl cutedsl,cutedsl:v10,cutedsl:q-first,cutedsl:epi-tma,cutedsl:gather-hint,flashmla

    (and `cutedsl:v11`: all three, the default before v12's O store a 64-column tile at a time;
    `cutedsl:spin-wait`: v11 with its stage waits polled, prefill_v11.SpinWait)
    """

    refusal = "a prefill A/B form: op attention only"


class FmhaQFirst(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:q-first", "q-first", QFirst


class FmhaEpiTma(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:epi-tma", "epi-tma", EpiTma


class FmhaGatherHint(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:gather-hint", "gather-hint", GatherHint


class FmhaSpinWait(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:spin-wait", "spin-wait", SpinWait


class FmhaV11(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:v11", "v11", V11


class FmhaV10(FmhaPrefillForm):
    name, variant, kernel_class = "cutedsl:v10", "v10", GatherAttentionSm90


# checked A/B forms of the sparse prefill (v10, v10 + one of v11's changes, v11): attention only; v12 without the
# consumers' stage fence (`cutedsl:no-fence`, 0.99-1.01x v12, set aside) is in git history at 5cf481d
PREFILL_VARIANTS = (FmhaV10, FmhaQFirst, FmhaEpiTma, FmhaGatherHint, FmhaSpinWait, FmhaV11)


class FmhaFusedDecode(FmhaCuteDSL):
    """`op: decode_fp8` by another form of the fused kernel (decode_fused.py) than the default
    (`FmhaCuteDSL.decode_form`, which `cutedsl` runs): v1 and the knock-outs below."""

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case.get("op", "attention") != "decode_fp8":
            return "the fused FP8 decode kernel: op decode_fp8 only"
        return super().supports(case, arch)


class FmhaDecodeV1(FmhaFusedDecode):
    """v1 of the FP8 decode (decode_fp8.py: dequant-gather into a bf16 workspace, the bf16 attention, the
    combine), the default until fused-pk-loop measured faster: kept for A/Bs."""

    name, variant, decode_form = "cutedsl:decode-v1", "decode-v1", None


class DecodeNoMath(PairsHandOff, FusedQTma):
    """The default FP8 decode whose consumers only wait for each K half and free it (the epilogue stores
    whatever O holds): the producer's time alone."""


class DecodeNoDequant(FusedQTma):
    """The default FP8 decode whose producer only hands the halves over (waits, publishes the indices,
    arrives: no row loads, no conversion, no stores): the consumers' time alone."""

    @cute.jit
    def _half(self, cache, dst, rows, sIdx, sMaskFlag, mine, t, h, k, full, empty, phase, stage):
        self._claim_half(sIdx, sMaskFlag, mine, t, k, empty, phase, stage)
        cute.arch.mbarrier_arrive(full)


class DecodeNoPrefetch(FusedQTma):
    """The default FP8 decode without the producer's L2 prefetches (a real answer): what they still buy."""

    def _prefetch_row(self, caches, second, v):
        pass


class FmhaDecodeNoPrefetch(FmhaFusedDecode):
    name, variant, decode_form = "cutedsl:decode-no-prefetch", "decode-no-prefetch", DecodeNoPrefetch


class FmhaDecodeNoMath(FmhaFusedDecode):
    name, variant, decode_form, checked = "cutedsl:decode-no-math", "decode-no-math", DecodeNoMath, False


class FmhaDecodeNoDequant(FmhaFusedDecode):
    name, variant, decode_form, checked = "cutedsl:decode-no-dequant", "decode-no-dequant", DecodeNoDequant, False


# v1, the default without its prefetches (checked), the default's knock-outs (unchecked), decode_fp8 only; the
# default is `cutedsl` (glue.py: decode_pair.FusedQTma); the v2-v5 forms are in git history at 1c17d89, the
# bulk-copy candidates at f43230f, the staged producers (v9, v9b) at ba41610, d5a0608, the consumers without the
# max hand-off (v10) at da750ad, the one-round-trip combine at 9a1293b, the prefetch two pairs ahead at 94f4045,
# the consumers split over d at 72989cd, the forced prefetch forms (decode-pf-all, decode-pf-first: the size rule
# v10 replaced) at a242f10
DECODE_VARIANTS = (FmhaDecodeV1, FmhaDecodeNoPrefetch, FmhaDecodeNoMath, FmhaDecodeNoDequant)
