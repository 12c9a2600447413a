"""Where the time of the MoE router kernel goes: v3 (`RouterKernel`) next to variants with one part
knocked out, the hash-layer kernel, an empty kernel of the same grid (the launch floor) and a device
copy of the logits' bytes, timed on the same inputs in one process with the
harness timer (CUDA events, L2 flushed per call) and with CUPTI (`kernel_times`: the device time of
the kernel itself, flush excluded). Knock-out outputs are garbage and not checked; every variant
that claims to be a correct kernel is compared with the oracle by the harness rule, and the v3
variants' expert ids with v3's (same ids in the same order: `same_ids_as_v3`). v2 (RouterKernelV2,
removed after this probe's H100 run) and its knock-outs are recorded in
benchmarks/results/router-h100-v3-ba2a2d2/router-probe.json.

    python3 benchmarks/router_probe.py --out router-probe.json

Cases: E = 384 (route_scale 2.5) and E = 256 (1.5), k = 6, T = 1 and T = 4096.

v3          full         the kernel (RouterKernel)
v3_*        no_fp64      weights from an fp32 chain (fp32 sqrt-softplus, sum, divide)
            no_topk      ids = lane; the scores are still computed and folded into the id (a sink)
            no_score     score = logit (no exp / log1p / sqrt in the selection)
            loads_only   score = logit, ids = lane (+ sink), weight = logit: loads and stores
v3_libsqrt  v3 with libdevice sqrt.rn.f32 (its slow path a branch per slot) in the selection
v3_bfly     v3 with v2's selection: per round a 5-level (key, id) butterfly instead of 2 redux.sync
hash_v3     the hash-layer kernel (ids from tid2eid; the same fp64 weights)
empty       a kernel of the same grid that does nothing
copy        torch copy of the logits' bytes (T·E·4 in, the same out)
"""

from __future__ import annotations

import time

import cutlass
import cutlass.cute as cute
import torch

from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.worker import case_generator
from kernels.common import compile_kernel
from kernels.router import family as rfam
from kernels.router.router import (
    WARP, WARPS_PER_CTA, Float32, Int32, RouterKernel, sqrt_softplus, tournament,
)
from probe_common import ARCH, empty_launch, run_probe, timed  # benchmarks/ is on sys.path as a script

TOPK = 6
MODELS = ((384, 2.5), (256, 1.5))
TOKENS = (1, 4096)


# ---------------------------------------------------------------- knock-outs (subclass mixins)
def fp32_weights(self, x, lane):
    s = sqrt_softplus(x)
    total = cute.arch.shuffle_sync(s, 0)
    for r in range(1, self.topk):
        total = total + cute.arch.shuffle_sync(s, r)
    return s / total * Float32(self.route_scale)


class NoFp64:
    def weights(self, x, lane):
        return fp32_weights(self, x, lane)


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


def variants(e: int, scale: float):
    """label → (kernel, hashed, checked)."""
    def mk(*bases):
        return type("Probe" + "".join(b.__name__ for b in bases), bases, {})

    base = RouterKernel
    return {
        "v3": (base(e, TOPK, scale, False), False, True),
        "v3_no_fp64": (mk(NoFp64, base)(e, TOPK, scale, False), False, False),
        "v3_no_topk": (mk(NoTopk, base)(e, TOPK, scale, False), False, False),
        "v3_no_score": (mk(NoScore, base)(e, TOPK, scale, False), False, False),
        "v3_loads_only": (mk(NoScore, NoTopk, RawWeights, base)(e, TOPK, scale, False), False, False),
        "v3_libsqrt": (mk(LibSqrt, base)(e, TOPK, scale, False), False, True),
        "v3_bfly": (mk(Butterfly, base)(e, TOPK, scale, False), False, True),
        "hash_v3": (base(e, TOPK, scale, True), True, True),
    }


def compile_router(kernel, e: int, hashed: bool):
    f = rfam._fake
    t = cute.sym_int()
    return compile_kernel(
        kernel, f(cutlass.Float32, (t, e)), None if hashed else f(cutlass.Float32, (e,)),
        f(cutlass.Int32, (cute.sym_int(), TOPK)) if hashed else None, f(cutlass.Int32, (t,)) if hashed else None,
        f(cutlass.Float32, (t, TOPK)), f(cutlass.Int32, (t, TOPK)), arch=ARCH)


def measure(timer, fn) -> dict:
    from dsv4bench.core.kernel_profile import kernel_times

    row = timed(timer, fn)
    kernels = kernel_times(fn, timer.flush)
    return {**row, "device_us": round(sum(kernels.values()), 3), "kernels": kernels}


def router_rows(timer):
    fam = rfam.RouterFamily()
    for e, scale in MODELS:
        t0 = time.time()
        compiled = {label: (compile_router(k, e, hashed), hashed, check)
                    for label, (k, hashed, check) in variants(e, scale).items()}
        print(f"# E={e}: {len(compiled)} variants compiled in {time.time() - t0:.1f} s", flush=True)
        for t in TOKENS:
            name = f"e{e}_t{t}"
            data = {}
            for hashed in (False, True):
                case = Case("router", {"t": t, "e": e, "k": TOPK, "scale": scale, "hashed": hashed,
                                       "vocab": 129280}, 0, "probe")
                x = fam.make_inputs(case, case_generator(case), "cuda")
                data[hashed] = (case, x, fam.oracle(case, x), fam.lowprec(case, x))
            v3_ids = {}
            for label, (fn_c, hashed, check) in compiled.items():
                case, x, oracle, lowprec = data[hashed]
                out = fam.alloc_outputs(case, "cuda")
                args = (x["logits"], x.get("bias"), x.get("tid2eid"), x.get("input_ids"), out["weights"], out["indices"])
                fn = lambda c=fn_c, a=args: c(*a)  # noqa: E731
                fn()
                torch.cuda.synchronize()
                row = {"case": name, "variant": label}
                if check:
                    ok, metrics = compare_outputs(out, oracle, lowprec, lambda n: fam.tolerance_for(case, n))
                    row["passes_oracle"] = bool(ok)
                    row["weights_max_abs"] = metrics["weights"].max_abs
                    row["weights_bound"] = metrics["weights"].bound
                    ids = out["indices"].cpu()
                    key = "hash" if hashed else "score"
                    if label == "v3":
                        v3_ids[key] = ids
                    elif key in v3_ids:
                        row["same_ids_as_v3"] = bool(torch.equal(ids, v3_ids[key]))
                row.update(measure(timer, fn))
                yield row
            grid = -(-t // WARPS_PER_CTA)
            yield {"case": name, "variant": "empty", **measure(timer, empty_launch(grid, WARP * WARPS_PER_CTA))}
            src = data[False][1]["logits"]
            dst = torch.empty_like(src)
            yield {"case": name, "variant": "copy", "bytes": 2 * src.numel() * 4,
                   **measure(timer, lambda: dst.copy_(src))}
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    run_probe(router_rows, with_copy=False)  # each case times a copy of its own logits
