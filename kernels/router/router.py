"""MoE router epilogue in CuTeDSL (spec §8.1), from the gate logits onward.

Scope: the router GEMM (x @ gate.T, fp32) is a GEMM and is not part of this kernel; it takes the
fp32 logits [T, E] and fuses
    s = sqrt(softplus(logits))                         (torch's softplus: x > 20 → x, else log1p(exp(x)))
    idx = top-k(s + bias)  (score layers)   or   idx = tid2eid[input_ids]  (hash layers 0-2)
    w = s[idx] / Σ s[idx] · route_scale                (the unbiased s)
Outputs: weights fp32 [T, k] and expert ids int32 [T, k], in selection order (descending biased
score; equal scores → the lower expert id first).

One warp per token: lane l owns experts l, l + 32, ... (coalesced scalar loads). Selection uses fp32
scores, as the reference does: libdevice expf / log1pf and a correctly rounded sqrt, because a
1e-6 score error flips near-tied 6th/7th experts. The k weights are recomputed in fp64 by lanes
0..k-1 from their logits and rounded once to fp32: ~0.5 ulp, where an fp32 chain (softplus, sum,
divide, scale) drifts by a few ulps. One source for sm_90a and sm_100a: shuffles, redux.sync,
libdevice math and two PTX instructions (rsqrt.approx, mul/fma.rn) that exist on both.

v3 (`RouterKernel`; v2, commit 397cb23, and its measurements are in docs/perf/router.md):
  * every load (12 logits and 12 bias values per lane at E = 384) is issued before any math. In v2
    each slot's load sat behind the previous slot's `sqrt.rn.f32`, whose slow path is a branch
    (BSSY/CALL): ptxas kept the loads in program order, so the 12 DRAM round trips were serial;
  * the selection sqrt is ptxas's own sqrt.rn fast path (MUFU.RSQ + one FFMA correction) with the
    tiny / zero / inf inputs handled by exact power-of-two scaling and selects instead of a branch:
    bit-identical to sqrt.rn.f32, and the 12 slots' chains interleave;
  * (score + bias) becomes a signed-orderable int32 key (ties between keys ⇔ equal floats), and
    each of the k rounds is two `redux.sync` (max key, then min id among the lanes holding it)
    instead of a 5-level butterfly of (value, id) shuffles; only the winning lane's 12-slot
    tournament changes between rounds (every lane recomputes it, branch-free).
Measured on the H100 (benchmarks/results/router/2026-11-22-h100-ba2a2d2-probe (in git history at 49e7d9d)): E = 384, T = 1 device 3.4 µs
(v2 7.8), T = 4096 9.4 µs (v2 12.5).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.bits import bits_f32, f32_bits

WARP = 32
WARPS_PER_CTA = 8
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus default
KEY_NONE = -(2**31)  # below every real score's key: padding slots and struck winners
ID_NONE = 2**31 - 1
SQRT_TINY = 2.0**-100  # below this sqrt.rn's fast path does not apply (it needs y >= 2^-101)


def sqrt_softplus(x):
    """sqrt(softplus(x)) in x's precision, with torch's threshold (x > 20 → x); libdevice sqrt."""
    return cute.math.sqrt(cutlass.select_(x > SOFTPLUS_THRESHOLD, x, cute.math.log1p(cute.math.exp(x))))


@dsl_user_op
def _sqrt_rn_fast(y, *, loc=None, ip=None) -> Float32:
    """ptxas's sqrt.rn.f32 fast path, valid (correctly rounded) for 2^-101 <= y <= FLT_MAX."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(y).ir_value(loc=loc, ip=ip)],
        "{\n.reg .f32 r, s, h, n, e;\n"
        "rsqrt.approx.ftz.f32 r, $1;\n"
        "mul.rn.ftz.f32 s, $1, r;\n"
        "mul.rn.ftz.f32 h, r, 0f3F000000;\n"
        "neg.f32 n, s;\n"
        "fma.rn.f32 e, n, s, $1;\n"
        "fma.rn.f32 $0, e, h, s;\n}",
        "=f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def sqrt_rn(y: Float32) -> Float32:
    """sqrt.rn.f32 without its slow-path branch: tiny y (denormals included) are scaled by 2^64
    exactly and the root by 2^-32 exactly (the root of any y >= 2^-149 is a normal fp32, so the
    rounding commutes with the scaling); 0 and +inf map to themselves; NaN and y < 0 give NaN."""
    tiny = y < Float32(SQRT_TINY)
    r = _sqrt_rn_fast(cutlass.select_(tiny, y * Float32(2.0**64), y))
    r = cutlass.select_(tiny, r * Float32(2.0**-32), r)
    return cutlass.select_((y == Float32(0.0)) | (y == Float32(float("inf"))), y, r)


def sqrt_softplus_f32(x: Float32) -> Float32:
    """The selection score: torch's fp32 sqrt(softplus(x)) with libdevice expf/log1pf, branch-free."""
    return sqrt_rn(cutlass.select_(x > SOFTPLUS_THRESHOLD, x, cute.math.log1p(cute.math.exp(x))))


def order_key(v: Float32) -> Int32:
    """A signed int32 with the order of the fp32 v: non-negative v keep their bits, negative v map
    to bits ^ 0x7fffffff (−0.0 → −1 sits below +0.0, which s + bias never produces: s >= +0)."""
    b = f32_bits(v)
    return cutlass.select_(b < Int32(0), b ^ Int32(0x7FFFFFFF), b)


def tournament(keys: list, ids: list):
    """(max key, its id) of one lane's slots; ties → the lower slot (= the lower id): pairs are
    formed in slot order and the right one wins only when strictly greater. Depth ceil(log2 n)."""
    cur = list(zip(keys, ids))
    while len(cur) > 1:
        nxt = []
        for i in range(0, len(cur) - 1, 2):
            (ka, ia), (kb, ib) = cur[i], cur[i + 1]
            take = kb > ka
            nxt.append((cutlass.select_(take, kb, ka), cutlass.select_(take, ib, ia)))
        if len(cur) % 2:
            nxt.append(cur[-1])
        cur = nxt
    return cur[0]


class RouterKernel:
    """v3. Compile-time: experts E, k, route_scale, hash or score routing. Runtime: tokens T.

    Overridable parts (the declared variants in kernels/router/variants.py knock them out): `score`
    (fp32 score of a logit), `select` (lane r < k gets the r-th winner id), `weights` (lane r's
    weight from its logit)."""

    def __init__(self, n_experts: int, topk: int, route_scale: float, hashed: bool):
        if not 1 <= topk <= min(n_experts, WARP):
            raise ValueError(f"top-{topk} of {n_experts} experts is not supported (k <= min(E, 32))")
        self.n_experts, self.topk, self.route_scale, self.hashed = n_experts, topk, route_scale, hashed
        self.slots = -(-n_experts // WARP)  # experts per lane

    @cute.jit
    def __call__(self, mL: cute.Tensor, mBias, mTid, mIds, mW: cute.Tensor, mI: cute.Tensor, stream):
        self.kernel(mL, mBias, mTid, mIds, mW, mI).launch(
            grid=[cute.ceil_div(mL.shape[0], WARPS_PER_CTA), 1, 1], block=[WARP * WARPS_PER_CTA, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mBias, mTid, mIds, mW: cute.Tensor, mI: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % WARP
        token = bidx * WARPS_PER_CTA + tidx // WARP
        if token < mL.shape[0]:  # uniform per warp
            my_idx = Int32(0)
            if cutlass.const_expr(self.hashed):
                if lane < self.topk:
                    my_idx = Int32(mTid[Int32(mIds[token]), lane])
            else:
                my_idx = self.select(self.keys(mL, mBias, token, lane), lane)
            x = Float32(0.0)
            if lane < self.topk:
                x = Float32(mL[token, my_idx])  # an L1 hit on score layers
            w = self.weights(x, lane)
            if lane < self.topk:
                mW[token, lane] = w
                mI[token, lane] = my_idx

    # ---------------------------------------------------------------- parts (traced, branch-free)
    def score(self, x: Float32) -> Float32:
        return sqrt_softplus_f32(x)

    def keys(self, mL, mBias, token, lane) -> list:
        """Every load first, then the order keys of s + bias (KEY_NONE past the last expert)."""
        e_max = self.n_experts - 1
        xs, bs = [], []
        for k in range(self.slots):
            e = lane + WARP * k
            if WARP * (k + 1) > self.n_experts:  # the ragged last slot: clamp the address
                e = cutlass.select_(e < self.n_experts, e, Int32(e_max))
            bs.append(Float32(mBias[e]))
            xs.append(Float32(mL[token, e]))
        # ptxas sinks the bias loads to their late use (after the 12 score chains: a second, serial
        # DRAM round trip at T = 1). One LOP3 per slot, x ^ (bias & zero) with zero = token >> 30
        # (0 for every T < 2^30, which ptxas cannot prove), ties them to the start of each chain.
        zero = token >> 30
        every = f32_bits(bs[0])
        for v in xs[1:] + bs[1:]:
            every = every | f32_bits(v)
        xs[0] = bits_f32(f32_bits(xs[0]) ^ (every & zero))
        keys = []
        for k in range(self.slots):
            key = order_key(self.score(xs[k]) + bs[k])
            if WARP * (k + 1) > self.n_experts:
                key = cutlass.select_(lane + WARP * k < self.n_experts, key, Int32(KEY_NONE))
            keys.append(key)
        return keys

    def select(self, keys: list, lane) -> Int32:
        """k rounds of (redux max key, redux min id among its holders); lane r keeps round r's id."""
        ids = [lane + WARP * k for k in range(self.slots)]
        best, best_id = tournament(keys, ids)
        my_idx = Int32(0)
        for r in range(self.topk):
            top = cute.arch.warp_redux_sync(best, "max")
            win = cute.arch.warp_redux_sync(cutlass.select_(best == top, best_id, Int32(ID_NONE)), "min")
            my_idx = cutlass.select_(lane == r, win, my_idx)
            if r + 1 < self.topk:
                keys = [cutlass.select_(ids[k] == win, Int32(KEY_NONE), keys[k]) for k in range(self.slots)]
                best, best_id = tournament(keys, ids)
        return my_idx

    def weights(self, x: Float32, lane) -> Float32:
        """Lane r < k: s_r / Σ s · route_scale, s in fp64 from the logit, one rounding to fp32."""
        s = sqrt_softplus(Float64(x))
        total = cute.arch.shuffle_sync(s, 0)
        for r in range(1, self.topk):
            total = total + cute.arch.shuffle_sync(s, r)
        return Float32(s / total * self.route_scale)

