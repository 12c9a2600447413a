"""DeepGEMM's own tile picks (its DG_PRINT_CONFIGS=1 lines) for every DSV4 FP8 linear at a few M, on a GPU:

    python3 benchmarks/deepgemm_configs.py 1,8,64,256,4096 > dg-configs.txt

Operands are random (unit scales): the pick depends on the shape only. docs/perf/gemm.md (v7) reads them."""
import os
import sys

import torch

os.environ["DG_PRINT_CONFIGS"] = "1"  # read when deep_gemm loads

from kernels.gemm.peers import deepgemm_product  # noqa: E402
from sweeps.gemm import LAYERS  # noqa: E402

ms = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 64, 256, 4096]
for model, layer, n, k, g in LAYERS:
    for m in ms:
        print(f"=== {model}.{layer} M {m} N {n} K {k} G {g}", flush=True)
        x = torch.randn(m, g * k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        deepgemm_product(x, torch.ones(m, g * k // 128, device="cuda"), w,
                         torch.ones(n // 128, k // 128, device="cuda"), y, g)
        torch.cuda.synchronize()
