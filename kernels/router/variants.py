"""Declared variants of the router kernel (v3, kernels/router/router.py): each knocks out or swaps one
of its overridable parts (`score`, `select`, `weights`), run through the harness beside the shipped
kernel on the same inputs:

    dsv4bench sweep router --impl cutedsl,cutedsl:no-fp64,cutedsl:no-topk,cutedsl:no-score,\\
        cutedsl:loads-only,cutedsl:libsqrt,cutedsl:bfly,cutedsl:empty-grid --bench

Knock-outs (`checked = False`: run, timed, never compared):
    cutedsl:no-fp64      weights from an fp32 chain (fp32 sqrt-softplus, sum, divide) instead of fp64
    cutedsl:no-topk      ids = lane; the scores are still computed and folded into the id (a sink)
    cutedsl:no-score     score = logit (no exp / log1p / sqrt in the selection)
    cutedsl:loads-only   score = logit, ids = lane (+ sink), weight = logit: loads and stores
    cutedsl:empty-grid   an empty kernel of the same grid and block (the launch floor, kernels/probes.py)
Ablations that compute the real answer (`checked = True`, they must pass the oracle):
    cutedsl:libsqrt      libdevice sqrt.rn.f32 (its slow path a branch per slot) in the selection
    cutedsl:bfly         v2's selection: per round a 5-level (key, id) butterfly instead of 2 redux.sync

The selection variants apply to score layers; `no-fp64` and `empty-grid` to hash layers too.
Dropped with benchmarks/router_probe.py: `hash_v3` (the shipped kernel on hash-layer cases: plain
`cutedsl`) and `copy` (the harness times a same-size device copy per case).

Imported at the end of kernels/router/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.probes import EmptyGridMixin
from kernels.router.family import RouterCuteDSL
from kernels.router.router import WARP, WARPS_PER_CTA, Float32, Int32, RouterKernel, sqrt_softplus, tournament


class NoFp64:
    def weights(self, x, lane):
        s = sqrt_softplus(x)
        total = cute.arch.shuffle_sync(s, 0)
        for r in range(1, self.topk):
            total = total + cute.arch.shuffle_sync(s, r)
        return s / total * Float32(self.route_scale)


class NoScore:
    def score(self, x):
        return x


class RawWeights:
    def weights(self, x, lane):
        return x


class NoTopk:
    def select(self, keys, lane):
        sink = keys[0]
        for key in keys[1:]:
            sink = sink ^ key
        return lane + Int32(sink == Int32(0x1234567))


class LibSqrt:
    def score(self, x):
        return sqrt_softplus(x)


class Butterfly:
    """v2's selection on v3's keys: per round the lane's best, then 5 butterfly levels of (key, id)."""

    def select(self, keys, lane):
        ids = [lane + WARP * k for k in range(self.slots)]
        my_idx = Int32(0)
        for r in range(self.topk):
            best, best_id = tournament(keys, ids)
            for o in range(5):
                v = cute.arch.shuffle_sync_bfly(best, offset=1 << o)
                i = cute.arch.shuffle_sync_bfly(best_id, offset=1 << o)
                take = (v > best) | ((v == best) & (i < best_id))
                best, best_id = cutlass.select_(take, v, best), cutlass.select_(take, i, best_id)
            my_idx = cutlass.select_(lane == r, best_id, my_idx)
            keys = [cutlass.select_(ids[k] == best_id, Int32(-(2**31)), keys[k]) for k in range(self.slots)]
        return my_idx


class RouterVariant(RouterCuteDSL):
    """A variant: `kernel_class` (RouterKernel with parts overridden) compiled in place of RouterKernel."""

    kernel_class: type = RouterKernel
    score_layers_only = True  # the part it changes is the score layers' selection

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if self.score_layers_only and case["hashed"]:
            return f"cutedsl:{self.variant} changes the score layers' selection (hash layers have none)"
        return super().supports(case, arch)

    def make_kernel(self, case: Case):
        return self.kernel_class(case["e"], case["k"], case["scale"], bool(case["hashed"]))


def _kernel(name: str, *parts: type) -> type:
    return type(name, (*parts, RouterKernel), {})


class RouterNoFp64(RouterVariant):
    name, variant, checked, score_layers_only = "cutedsl:no-fp64", "no-fp64", False, False
    kernel_class = _kernel("RouterNoFp64Kernel", NoFp64)


class RouterNoTopk(RouterVariant):
    name, variant, checked = "cutedsl:no-topk", "no-topk", False
    kernel_class = _kernel("RouterNoTopkKernel", NoTopk)


class RouterNoScore(RouterVariant):
    name, variant, checked = "cutedsl:no-score", "no-score", False
    kernel_class = _kernel("RouterNoScoreKernel", NoScore)


class RouterLoadsOnly(RouterVariant):
    name, variant, checked = "cutedsl:loads-only", "loads-only", False
    kernel_class = _kernel("RouterLoadsOnlyKernel", NoScore, NoTopk, RawWeights)


class RouterLibSqrt(RouterVariant):
    name, variant, checked = "cutedsl:libsqrt", "libsqrt", True
    kernel_class = _kernel("RouterLibSqrtKernel", LibSqrt)


class RouterButterfly(RouterVariant):
    name, variant, checked = "cutedsl:bfly", "bfly", True
    kernel_class = _kernel("RouterButterflyKernel", Butterfly)


class RouterEmptyGrid(EmptyGridMixin, RouterVariant):
    name, variant, checked, score_layers_only = "cutedsl:empty-grid", "empty-grid", False, False

    def launch_shape(self, case: Case):
        return (-(-case["t"] // WARPS_PER_CTA), 1, 1), WARP * WARPS_PER_CTA


VARIANTS = (RouterNoFp64(), RouterNoTopk(), RouterNoScore(), RouterLoadsOnly(), RouterLibSqrt(), RouterButterfly(),
            RouterEmptyGrid())
for _impl in VARIANTS:
    register_impl(_impl)
