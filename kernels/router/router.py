"""MoE router epilogue in CuTeDSL (spec §8.1), from the gate logits onward.

Scope: the router GEMM (x @ gate.T, fp32) is a GEMM and is not part of this kernel; it takes the
fp32 logits [T, E] and fuses
    s = sqrt(softplus(logits))                         (torch's softplus: x > 20 → x, else log1p(exp(x)))
    idx = top-k(s + bias)  (score layers)   or   idx = tid2eid[input_ids]  (hash layers 0-2)
    w = s[idx] / Σ s[idx] · route_scale                (the unbiased s)
Outputs: weights fp32 [T, k] and expert ids int32 [T, k], in selection order (descending biased
score; equal scores → the lower expert id first).

One warp per token: lane l owns experts l, l + 32, ... (coalesced scalar loads). Top-k is k rounds
of "each lane's best, then a butterfly arg-max over the warp"; the winner is struck out, and lane r
keeps round r's winner. Selection uses fp32 scores, as the reference does. The k weights are
recomputed in fp64 by lanes 0..k-1 from their logits and rounded once to fp32: ~0.5 ulp, where an
fp32 chain (softplus, sum, divide, scale) drifts by a few ulps.
One source for sm_90a and sm_100a: shuffles and libdevice math only.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32

WARP = 32
WARPS_PER_CTA = 8
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus default


def sqrt_softplus(x):
    """sqrt(softplus(x)) in x's precision, with torch's threshold (x > 20 → x)."""
    return cute.math.sqrt(cutlass.select_(x > SOFTPLUS_THRESHOLD, x, cute.math.log1p(cute.math.exp(x))))


class RouterKernel:
    """Compile-time: experts E, k, route_scale, hash or score routing. Runtime: tokens T."""

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
            my_idx = self.select(mL, mBias, mTid, mIds, token, lane)
            # The weights: the k lanes recompute their expert's score in fp64 and round once at the end.
            s = Float64(0.0)
            if lane < self.topk:
                s = sqrt_softplus(Float64(Float32(mL[token, my_idx])))
            total = Float64(0.0)
            for r in cutlass.range_constexpr(self.topk):
                total = total + cute.arch.shuffle_sync(s, r)
            if lane < self.topk:
                mW[token, lane] = Float32(s / total * self.route_scale)
                mI[token, lane] = my_idx

    @cute.jit
    def select(self, mL, mBias, mTid, mIds, token, lane):
        """Lane r < k gets the r-th expert id: tid2eid's, or the r-th largest fp32 s + bias."""
        my_idx = Int32(0)
        if cutlass.const_expr(self.hashed):
            if lane < self.topk:
                my_idx = Int32(mTid[Int32(mIds[token]), lane])
        else:
            biased = cute.make_rmem_tensor((self.slots,), Float32)
            for k in cutlass.range_constexpr(self.slots):
                e = lane + WARP * k
                biased[k] = Float32(-float("inf"))
                if e < self.n_experts:
                    biased[k] = sqrt_softplus(Float32(mL[token, e])) + Float32(mBias[e])
            for r in cutlass.range_constexpr(self.topk):
                best_v, best_i = biased[0], lane
                for k in cutlass.range_constexpr(1, self.slots):
                    better = biased[k] > best_v
                    best_v = cutlass.select_(better, biased[k], best_v)
                    best_i = cutlass.select_(better, lane + WARP * k, best_i)
                for o in cutlass.range_constexpr(5):  # butterfly arg-max; equal values → lower id
                    v = cute.arch.shuffle_sync_bfly(best_v, offset=1 << o)
                    i = cute.arch.shuffle_sync_bfly(best_i, offset=1 << o)
                    take = (v > best_v) | ((v == best_v) & (i < best_i))
                    best_v = cutlass.select_(take, v, best_v)
                    best_i = cutlass.select_(take, i, best_i)
                for k in cutlass.range_constexpr(self.slots):
                    if best_i == lane + WARP * k:
                        biased[k] = Float32(-float("inf"))
                if lane == r:
                    my_idx = best_i
        return my_idx
