"""DeepGEMM's own tile picks (its DG_PRINT_CONFIGS=1 lines) for every DSV4 FP8 linear at a few M, on a GPU:

    python3 benchmarks/deepgemm_configs.py 1,8,64,256,4096 > dg-configs.txt

Operands are random (unit scales): the pick depends on the shape only. docs/perf/gemm.md (v7) reads them."""
import os, sys, torch
os.environ["DG_PRINT_CONFIGS"] = "1"
import deep_gemm
from sweeps.gemm import LAYERS
ms = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 64, 256, 4096]
for model, layer, n, k, g in LAYERS:
    for m in ms:
        print(f"=== {model}.{layer} M {m} N {n} K {k} G {g}", flush=True)
        x = torch.randn(m, g * k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.ones(m, g * k // 128, device="cuda")
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sw = torch.ones(n // 128, k // 128, device="cuda")
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        if g == 1:
            deep_gemm.fp8_gemm_nt((x, sa), (w, sw), y)
        else:
            deep_gemm.fp8_einsum("bhr,hdr->bhd", (x.view(m, g, k), sa.view(m, g, -1)),
                                 (w.view(g, -1, k), sw.view(g, -1, k // 128)), y.view(m, g, -1))
        torch.cuda.synchronize()
