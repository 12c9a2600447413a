"""Probe: how fast can a weight stream go, and does the GEMM's access order cost bandwidth?

Decode GEMMs read their weight once, in 128-byte pieces of many rows at a time (a CTA owns bn rows
and walks K). This times, in one process with the L2 flushed, for each weight shape:
  copy       the harness's same-traffic floor: a device copy moving the weight's bytes (half each way)
  max        torch's read-only reduction over the weight (a plain sequential stream)
  rows-KC    a Triton kernel, one program per bn-row tile walking K in KC-byte pieces (the GEMM's order)
  linear     the same programs each reading one contiguous span of the same size
  gemm       our FP8 GEMM at M = 1 on that weight (the rule's config)
and prints each as TB/s of weight bytes. Usage: python3 benchmarks/stream_probe.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dsv4bench.core.ceilings import SameTrafficCopy
from dsv4bench.core.timing import CudaTimer

LAYERS = {  # name: (N, K, groups) from docs/perf/gemm.md's roofline table
    "flash.wo_b": (4096, 8192, 1),
    "flash.shared_w2": (4096, 2048, 1),
    "pro.wq_b": (65536, 1536, 1),
    "pro.wo_b": (7168, 16384, 1),
    "pro.shared_w13": (6144, 7168, 1),
    "pro.wo_a": (16384, 4096, 16),
    "flash.wo_a": (8192, 4096, 8),
    "pro.mtp_proj": (7168, 7168, 1),
}


def triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def rows(w, out, K4, BN: tl.constexpr, KC4: tl.constexpr):
        """Program p owns rows [p*BN, (p+1)*BN) and walks K in KC4 int32 words a row."""
        r = tl.program_id(0) * BN + tl.arange(0, BN)
        acc = tl.zeros([BN, KC4], dtype=tl.int32)
        for k in range(0, K4, KC4):
            acc ^= tl.load(w + r[:, None] * K4 + k + tl.arange(0, KC4)[None, :])
        tl.store(out + tl.program_id(0), tl.sum(acc, axis=None))

    @triton.jit
    def linear(w, out, span, BN: tl.constexpr, KC4: tl.constexpr):
        """Program p reads words [p*span, (p+1)*span) in BN*KC4-word pieces."""
        base = tl.program_id(0) * span
        acc = tl.zeros([BN * KC4], dtype=tl.int32)
        for k in range(0, span, BN * KC4):
            acc ^= tl.load(w + base + k + tl.arange(0, BN * KC4))
        tl.store(out + tl.program_id(0), tl.sum(acc, axis=None))

    return rows, linear


def layer_gemm(m, n, k, groups):
    """The rule's config for the layer at M rows, its operands (seed 1) and an output buffer."""
    from kernels.gemm.config import choose_config
    from kernels.gemm.glue import make_operands

    cfg = choose_config(m, n, k, groups=groups)
    return cfg, make_operands(m, n, k, seed=1, device="cuda", groups=groups), torch.empty(
        m, n, dtype=torch.bfloat16, device="cuda")


def probe(name, n, k, groups, timer, kernels):
    from kernels.gemm.glue import compile_gemm, run_gemm

    cfg, (x, sa, w, sw), out = layer_gemm(1, n, k, groups)
    wbytes = w.numel()
    words = w.view(torch.int32)
    res = {"layer": name, "n": n, "k": k, "weight_mb": wbytes / 1e6, "bn": cfg.bn, "tiles": n // cfg.bn}

    def rate(fn):
        return round(wbytes / timer.time(fn, min_iters=30).median_ms / 1e9, 3)

    res["copy"] = round(wbytes / SameTrafficCopy(timer, "cuda").ms(wbytes) / 1e9, 3)
    res["max"] = rate(lambda: words.max())
    compiled = compile_gemm(cfg)
    res["gemm"] = rate(lambda: run_gemm(compiled, cfg, x, sa, w, sw, out, groups))
    if kernels:
        rows, linear = kernels
        red = torch.empty(n, dtype=torch.int32, device="cuda")
        # (BN rows a program, KC bytes a piece, warps, stages): the GEMM's tile, then small tiles
        # (many CTAs a SM, so the pull is not one CTA's): rows-* walk K like the GEMM, linear-* read
        # one contiguous span of the same size a program.
        for bn, kc, warps, st in ((cfg.bn, 128, 4, 8), (8, 128, 2, 4), (8, 128, 2, 8), (4, 128, 1, 8),
                                  (8, 512, 4, 4), (2, 512, 1, 8)):
            if bn * kc > 16384:  # the tile lives in registers: 128 B a thread at most
                continue
            tiles = n // bn
            res[f"rows-{bn}x{kc}-w{warps}s{st}"] = rate(
                lambda: rows[(tiles,)](words, red, k // 4, BN=bn, KC4=kc // 4, num_stages=st, num_warps=warps))
            span = wbytes // 4 // tiles
            res[f"linear-{bn}x{kc}-w{warps}s{st}"] = rate(
                lambda: linear[(tiles,)](words, red, span, BN=bn, KC4=kc // 4, num_stages=st, num_warps=warps))
    return res


def gemm_only(n, k, groups):
    from kernels.gemm.glue import compile_gemm, run_gemm

    cfg, (x, sa, w, sw), out = layer_gemm(1, n, k, groups)
    compiled = compile_gemm(cfg)
    for _ in range(3):
        run_gemm(compiled, cfg, x, sa, w, sw, out, groups)
    torch.cuda.synchronize()


def config_sweep(name, n, k, groups, m, timer, split_forms=False):
    """The rule's config against K-split forms: `hw` launches one CTA per unit (the hardware's
    block scheduler deals them as SMs free up; a short ring lets several CTAs share an SM),
    `static` keeps the persistent grid of one CTA per SM."""
    from dataclasses import replace

    from kernels.gemm.glue import compile_gemm, run_gemm

    base, (x, sa, w, sw), out = layer_gemm(m, n, k, groups)
    copy_us = SameTrafficCopy(timer, "cuda").ms(w.numel()) * 1e3
    res = {"layer": name, "m": m, "rule": str((base.bm, base.bn, base.split_k, base.n_stages)),
           "copy_us": round(copy_us, 2)}
    tiles = -(-m // base.bm) * -(-n // base.bn)
    forms = [("rule", base, None)]
    if split_forms:
        for split in (2, 4, 8):
            for stages in (0, 8, 4):
                cfg = replace(base, split_k=split, stages=stages)
                forms.append((f"hw-s{split}-st{cfg.n_stages}", cfg, tiles * split))
            forms.append((f"static-s{split}", replace(base, split_k=split), None))
    else:  # the ring's depth: at most `cap` KB of weight in flight a CTA, on the rule's bn and its neighbours
        for bn in sorted({base.bn, max(32, base.bn // 2), min(128, base.bn * 2)}):
            seen = set()
            for cap in (0, 32, 64, 96):
                if (bn, cap) == (base.bn, 0) or groups > 1 and (n // groups) % bn:
                    continue
                try:
                    cfg = replace(base, bn=bn, stages=max(4, cap * 1024 // (bn * 128)) if cap else 0)
                except ValueError:  # more stages than fit (the check that cost the first M = 64 run)
                    continue
                if cfg.n_stages in seen:
                    continue
                seen.add(cfg.n_stages)
                forms.append((f"bn{bn}-cap{cap}-st{cfg.n_stages}", cfg, None))
    for label, cfg, ctas in forms:
        try:
            compiled = compile_gemm(cfg)
            us = timer.time(lambda: run_gemm(compiled, cfg, x, sa, w, sw, out, groups, n_ctas=ctas),
                            min_iters=30).median_ms * 1e3
            res[label] = round(us, 2)
        except Exception as e:  # noqa: BLE001 - a config that does not build is reported, not fatal
            res[label] = f"error: {type(e).__name__}: {str(e)[:80]}"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--configs", default=None, help="M values: time ring depths against the rule")
    ap.add_argument("--split-forms", action="store_true", help="--configs times K-split forms instead")
    ap.add_argument("--ncu", default=None, help="run only this layer's GEMM three times (under ncu)")
    args = ap.parse_args()
    timer = CudaTimer("cuda")
    try:
        kernels = triton_kernels()
    except Exception as e:  # noqa: BLE001 - the probe still times copy / max / gemm
        print(f"triton unavailable: {e}", file=sys.stderr)
        kernels = None
    if args.ncu:
        return gemm_only(*LAYERS[args.ncu])
    if args.configs:
        for m in (int(v) for v in args.configs.split(",")):
            for name in LAYERS:
                print(json.dumps(config_sweep(name, *LAYERS[name], m, CudaTimer("cuda"), args.split_forms)),
                      flush=True)
        return None
    print(torch.cuda.get_device_name(), flush=True)
    rows = []
    for name, (n, k, g) in LAYERS.items():
        r = probe(name, n, k, g, timer, kernels)
        print(json.dumps(r), flush=True)
        rows.append(r)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
