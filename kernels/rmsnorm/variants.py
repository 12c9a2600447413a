"""Declared variants of the RMSNorm kernel: its tuning knob sets (RmsNormConfig, kernels/rmsnorm/rmsnorm.py),
each `cutedsl:<knobs-name>`, run through the harness beside the shipped default, QuACK, torch.compile
and eager on the same inputs:

    dsv4bench sweep rmsnorm --width 7168,4096,512 --impl cutedsl,quack,cutedsl:t256,cutedsl:rr_t512_el_ef --bench

Every knob set computes the real answer (`checked = True`: it must pass the oracle). A set that does
not fit a width (more threads per row than the row has vectors) is UNSUPPORTED there. `base` (no
knobs) of benchmarks/rmsnorm_variants.py is the shipped kernel, `cutedsl`.

    ld_na / ld_cs / ld_nc      x loads `ld.global.L1::no_allocate` / `.cs` / `.nc`
    st_cs                      y stores `st.global.cs`;  na_cs: both na loads and cs stores
    l2ef                       L1 no_allocate + an L2 evict_first policy on x loads and y stores
    w_late                     v2: the weight loaded after the reduction
    rr, rr_el_ef               two passes over x (x read again after the reduction), the second with
                               Inductor's hints (evict_last, then evict_first)
    loop2 / loop4 / loop16     R row tiles per CTA, the next tile's x loaded before this one's reduction
    loop4_na_cs                loop4 + na_cs
    tT                         threads_per_row T (16, 64, 128, 256, 512)
    tT_na_cs, tT_loop4         T = 256 (the 7168 candidate), 128 (4096), 16 (512) with na_cs / loop4
    rr_tT, rr_tT_el_ef         two passes with T = 256, 512 threads per row (rr_t512_el_ef: Inductor's
                               kernel at 7168 and 4096, also the shipped default there)

Imported at the end of kernels/rmsnorm/family.py; registers its impls itself (register_impl).
"""

from __future__ import annotations

from dsv4bench.core.case import Case
from dsv4bench.core.registry import register_impl
from kernels.common import CUTE_DTYPES
from kernels.rmsnorm.family import RmsNormCuteDSL
from kernels.rmsnorm.rmsnorm import RmsNormConfig

HINT_KNOBS = {
    "ld_na": {"load_hint": "na"},
    "ld_cs": {"load_hint": "cs"},
    "ld_nc": {"load_hint": "nc"},
    "st_cs": {"store_hint": "cs"},
    "na_cs": {"load_hint": "na", "store_hint": "cs"},
    "l2ef": {"load_hint": "na_l2ef", "store_hint": "l2ef"},
    "w_late": {"w_early": False},  # v2: the weight loaded after the reduction
    # two passes over x, the weight read in the second (w_early would keep it live in the first)
    "rr": {"reload_hint": "none", "w_early": False},
    "rr_el_ef": {"load_hint": "el_l2el", "reload_hint": "ef_l2ef", "w_early": False},
    "loop2": {"tiles_per_cta": 2},
    "loop4": {"tiles_per_cta": 4},
    "loop16": {"tiles_per_cta": 16},
    "loop4_na_cs": {"tiles_per_cta": 4, "load_hint": "na", "store_hint": "cs"},
}
THREADS = (16, 64, 128, 256, 512)  # threads_per_row candidates beside the default split
FIRST_THREADS = (256, 128, 16)  # the first candidate of 7168, 4096 and 512, combined with na_cs / loop4
RELOAD_THREADS = (256, 512)  # threads_per_row of the two-pass variants (7168 and 4096)


def knob_sets() -> dict[str, dict]:
    """Every declared knob set: name -> RmsNormKernel knobs."""
    out = dict(HINT_KNOBS)
    for t in THREADS:
        out[f"t{t}"] = {"threads_per_row": t}
    for t in FIRST_THREADS:
        out[f"t{t}_na_cs"] = {"threads_per_row": t, "load_hint": "na", "store_hint": "cs"}
        out[f"t{t}_loop4"] = {"threads_per_row": t, "tiles_per_cta": 4}
    for t in RELOAD_THREADS:
        out[f"rr_t{t}"] = {"threads_per_row": t, **HINT_KNOBS["rr"]}
        out[f"rr_t{t}_el_ef"] = {"threads_per_row": t, **HINT_KNOBS["rr_el_ef"]}
    return out


class RmsNormKnobs(RmsNormCuteDSL):
    """The shipped kernel compiled with a knob set (`knobs`) instead of the width's default."""

    def __init__(self, name: str, knobs: dict):
        self.variant, self.name, self.knobs = name, f"cutedsl:{name}", dict(knobs)

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        try:
            RmsNormConfig.for_width(case["n"], CUTE_DTYPES[case["dtype"]].width, **self.knobs)
        except ValueError as e:
            return f"{self.name}: {e}"
        return super().supports(case, arch)


VARIANTS = tuple(RmsNormKnobs(name, knobs) for name, knobs in knob_sets().items())
for _impl in VARIANTS:
    register_impl(_impl)
