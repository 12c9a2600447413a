"""One moe case's layer call, twice (compile and warm, then the call to profile), for ncu to pick a launch:

    ncu --kernel-name regex:sm90_fp8_gemm_1d2d --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        python3 benchmarks/moe_one_call.py --model pro --tokens 4096 --impl deepgemm-kernels

Peers compile nothing (their run takes compiled=None)."""

from __future__ import annotations

import argparse

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.evaluate import case_generator
from dsv4bench.core.registry import get_impl, load_families
from kernels.moe.family import FAMILY
from sweeps.moe import LOADS, MODELS
from sweeps.moe import case as moe_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pro", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--load", default="uniform", choices=LOADS)
    ap.add_argument("--experts", type=int, default=None, help="the layer's experts (default: the sweep's cap)")
    ap.add_argument("--impl", default="cutedsl")
    a = ap.parse_args()
    load_families()
    params = moe_case("layer", a.model, a.tokens, a.load, e=a.experts)
    case = Case("moe", params, seed=0, origin="cli")
    impl = get_impl("moe", a.impl)
    inputs = FAMILY.make_inputs(case, case_generator(case), "cuda")
    out = FAMILY.alloc_outputs(case, "cuda")
    try:
        compiled = impl.compile(case, "sm_90a")
    except NotImplementedError:
        compiled = None
    for _ in range(2):
        impl.run(case, inputs, out, compiled)
    torch.cuda.synchronize()
    print("done", params, flush=True)


if __name__ == "__main__":
    main()
