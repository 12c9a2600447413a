"""RMSNorm tuning variants beside QuACK, torch.compile, torch eager and a device copy, one process.

    source .gpu/setup.sh && python3 benchmarks/rmsnorm_variants.py --out $OUT/rmsnorm-variants.json
    python3 benchmarks/rmsnorm_variants.py --compile-only        # no GPU: compiles every variant

Every variant (kernels/rmsnorm/rmsnorm.py: variants(n)) is compiled, run once with NaN-poisoned
outputs and judged against the FP32 oracle by the project's rule (dsv4bench.core.compare, as the
worker does; inputs must come back unchanged), then timed with the project's timer (CUDA events,
L2 flushed, median of >= 30). Impls are timed in `--rounds` rounds, the order rotated each
round, and each impl's samples pooled, so slow drift of the clocks hits every impl alike. Ratios
are QuACK's time over ours (>= 1: ours is at least as fast); % copy is against the harness's
device-to-device copy ceiling (dsv4bench/core/ceilings.py) measured in the same process.
"torch_compile" is the harness's baseline (dsv4bench/core/torch_impls.py); `--inductor-code DIR`
writes the code Inductor generates for it, per shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch

from dsv4bench.compile.artifacts import artifact
from dsv4bench.compile.cubin import parse_cubin
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.registry import get_family, get_impl
from dsv4bench.core.timing import summarize
from kernels.rmsnorm.family import compile_rmsnorm
from kernels.rmsnorm.rmsnorm import RmsNormConfig, variants
from oracles.norm import NORM_EPS

SHAPES = ((16384, 7168), (16384, 4096), (65536, 512))
DTYPE = "bf16"
PEERS = ("quack", "torch_compile", "eager", "copy")


def compile_all(shapes, arch: str, only: set[str] | None) -> dict:
    """(m, n) -> name -> {knobs, config, compile_s, registers, local_bytes, smem, fn | error}."""
    out = {}
    for m, n in shapes:
        out[(m, n)] = {}
        for name, knobs in variants(n).items():
            if only and name not in only:
                continue
            cfg = RmsNormConfig.for_width(n, 16, **knobs)
            rec = {
                "knobs": knobs,
                "config": {
                    "threads_per_row": cfg.threads_per_row,
                    "vecs_per_thread": cfg.vecs_per_thread,
                    "rows_per_cta": cfg.rows_per_cta,
                    "cta_threads": cfg.threads,
                },
            }
            t0 = time.perf_counter()
            try:
                fn = compile_rmsnorm(DTYPE, n, True, arch, **knobs)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                out[(m, n)][name] = rec
                continue
            rec["compile_s"] = round(time.perf_counter() - t0, 3)
            info = parse_cubin(artifact(fn))
            rec.update(
                registers=info.registers,
                local_bytes=info.local_bytes,
                smem_bytes=info.static_smem_bytes,
            )
            rec["fn"] = fn
            out[(m, n)][name] = rec
    return out


def device_info() -> dict:
    import cutlass

    info = {
        "torch": torch.__version__,
        "cutlass_dsl": getattr(cutlass, "__version__", "?"),
        "commit": os.environ.get("DSV4BENCH_COMMIT", ""),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda
        )
    try:
        import quack

        info["quack"] = getattr(quack, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        info["quack"] = f"not importable ({type(e).__name__})"
    return info


def table(rows: list[list[str]], header: list[str], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in header:
            t.add_column(h, justify="left" if h in ("variant", "knobs") else "right")
        for r in rows:
            t.add_row(*r)
        Console(width=200).print(t)
    except ImportError:
        print(title)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def print_compile(compiled: dict, arch: str) -> None:
    for (m, n), recs in compiled.items():
        rows = [
            [
                name,
                json.dumps(r["knobs"]),
                "{threads_per_row}x{vecs_per_thread}x{rows_per_cta}".format(
                    **r["config"]
                ),
                str(r.get("registers", "-")),
                str(r.get("local_bytes", "-")),
                f"{r['compile_s']:.2f}" if "compile_s" in r else r.get("error", ""),
            ]
            for name, r in recs.items()
        ]
        table(
            rows,
            ["variant", "knobs", "thr x vec x rows", "regs", "local B", "compile s"],
            f"rmsnorm {DTYPE} {m}x{n} weighted, {arch}",
        )


def run_gpu(compiled: dict, rounds: int, min_iters: int, inductor_code: str | None) -> dict:
    import torch.nn.functional as F

    from dsv4bench.core.ceilings import _copy_gbps
    from dsv4bench.core.timing import CudaTimer
    from dsv4bench.core.worker import CaseData, poison

    fam = get_family("rmsnorm")
    timer = CudaTimer("cuda")
    copy_gbps = _copy_gbps(
        timer, "cuda"
    )  # the harness's ceiling: 1 GiB device-to-device copy
    print(f"copy ceiling: {copy_gbps:.0f} GB/s")
    try:
        from quack.rmsnorm import rmsnorm_fwd
    except Exception as e:  # noqa: BLE001 - QuACK missing or failing to import: no ratios
        rmsnorm_fwd = None
        print(f"QuACK not importable ({type(e).__name__}: {e}); no ratios")

    results = {}
    for (m, n), recs in compiled.items():
        case = Case("rmsnorm", {"m": m, "n": n, "dtype": DTYPE, "weight": True}, 0)
        tol = lambda k, case=case: fam.tolerance_for(case, k)
        data = CaseData(fam, case, "cuda")
        x, w = data.inputs["x"], data.inputs["w"]
        x_before = x.clone()
        cost = fam.cost(case)
        out = torch.empty_like(x)

        calls = {}
        for name, r in recs.items():
            if "fn" in r:
                calls[name] = lambda fn=r["fn"], x=x, w=w, out=out: fn(x, w, out)
        if rmsnorm_fwd is not None:
            calls["quack"] = lambda x=x, w=w: rmsnorm_fwd(x, w, eps=NORM_EPS)[0]
        inductor = get_impl("rmsnorm", "torch_compile")
        calls["torch_compile"] = lambda x=x, w=w, case=case: inductor.run(
            case, {"x": x, "w": w}, {}, None
        )["out"]
        if inductor_code:
            from torch._inductor.utils import run_and_get_code

            _, codes = run_and_get_code(calls["torch_compile"])
            path = Path(inductor_code) / f"rmsnorm-{m}x{n}-inductor.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n\n".join(codes))
            print(f"wrote {path}")
        calls["eager"] = lambda x=x, w=w, n=n: F.rms_norm(x, (n,), w, NORM_EPS)
        calls["copy"] = lambda x=x, out=out: out.copy_(
            x
        )  # the same bytes moved, no math

        entry = {name: dict(r) for name, r in recs.items()}
        for r in entry.values():
            r.pop("fn", None)
        for name in PEERS:
            if name in calls:
                entry[name] = {}
        # correctness first: poisoned output, one call, the project's rule, inputs unchanged
        for name, call in calls.items():
            if name == "copy":
                continue
            poison({"out": out})
            res = call()
            torch.cuda.synchronize()
            got = out if name in recs else res
            ok, metrics = compare_outputs({"out": got}, data.oracle, data.lowprec, tol)
            clean = torch.equal(x, x_before)
            entry[name]["passed"] = bool(ok and clean)
            entry[name]["check"] = metrics["out"].summary() + (
                "" if clean else "; inputs modified"
            )
            if not entry[name]["passed"]:
                print(f"{m}x{n} {name}: FAIL {entry[name]['check']}")
        timed = [k for k in calls if entry[k].get("passed", True)]
        samples = {k: [] for k in timed}
        round_ms = {k: [] for k in timed}  # each round's median
        for rnd in range(rounds):
            order = timed[rnd % len(timed) :] + timed[: rnd % len(timed)]
            for name in order:
                got = timer.time(calls[name], min_iters=min_iters).samples_ms
                samples[name] += got
                round_ms[name].append(statistics.median(got))
        # the timed outputs are validated again (a variant must stay right under repetition)
        for name in timed:
            if name == "copy":
                continue
            poison({"out": out})
            res = calls[name]()
            torch.cuda.synchronize()
            ok, _ = compare_outputs(
                {"out": out if name in recs else res},
                data.oracle,
                data.lowprec,
                tol,
            )
            entry[name]["passed"] = bool(entry[name]["passed"] and ok)
        quack_ms = statistics.median(samples["quack"]) if "quack" in samples else None
        for name in timed:
            st = summarize(samples[name], True)
            gbps = cost.bytes / (st.median_ms / 1e3) / 1e9
            entry[name]["timing"] = {
                k: v for k, v in st.to_json().items() if k != "samples_ms"
            }
            entry[name]["us"] = st.median_ms * 1e3
            entry[name]["gbps"] = gbps
            entry[name]["pct_copy"] = 100.0 * gbps / copy_gbps
            entry[name]["vs_quack"] = quack_ms / st.median_ms if quack_ms else None
            entry[name]["round_us"] = [t * 1e3 for t in round_ms[name]]
            if "quack" in round_ms:
                entry[name]["round_vs_quack"] = [
                    q / t for q, t in zip(round_ms["quack"], round_ms[name])
                ]
        results[f"{m}x{n}"] = {
            "m": m,
            "n": n,
            "dtype": DTYPE,
            "weight": True,
            "bytes": cost.bytes,
            "impls": entry,
        }

        rows = []
        for name, r in entry.items():
            if "us" not in r:
                rows.append(
                    [
                        name,
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        str(r.get("registers", "-")),
                        r.get("error") or r.get("check", ""),
                    ]
                )
                continue
            rows.append(
                [
                    name,
                    f"{r['us']:.1f}",
                    f"{r['gbps']:.0f}",
                    f"{r['pct_copy']:.1f}",
                    f"{r['vs_quack']:.3f}" if r["vs_quack"] else "-",
                    " ".join(f"{v:.3f}" for v in r.get("round_vs_quack", ())),
                    f"{r['timing']['cv']:.3f}",
                    str(r.get("registers", "-")),
                    "ok" if r.get("passed", True) else "FAIL",
                ]
            )
        table(
            rows,
            ["variant", "us", "GB/s", "% copy", "quack/ours", "per round", "cv", "regs", "check"],
            f"rmsnorm {DTYPE} {m}x{n} weighted (copy ceiling {copy_gbps:.0f} GB/s)",
        )
        data = x = w = x_before = out = calls = (
            None  # free this shape's tensors before the next
        )
        torch.cuda.empty_cache()
    return {"copy_gbps": copy_gbps, "shapes": results}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", help="write the results here (JSON)")
    ap.add_argument(
        "--compile-only",
        action="store_true",
        help="compile every variant (no GPU needed), no timing",
    )
    ap.add_argument("--arch", help="default: the GPU's (sm_XYa), or sm_90a without one")
    ap.add_argument(
        "--shapes", help="MxN,MxN (default: 16384x7168,16384x4096,65536x512)"
    )
    ap.add_argument("--variants", help="comma-separated variant names (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inductor-code", help="write Inductor's generated code per shape here")
    ap.add_argument("--min-iters", type=int, default=30)
    args = ap.parse_args()

    shapes = SHAPES
    if args.shapes:
        shapes = tuple(
            tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")
        )
    only = set(args.variants.split(",")) | {"base"} if args.variants else None
    gpu = torch.cuda.is_available() and not args.compile_only
    arch = args.arch
    if arch is None:
        arch = (
            "sm_{}{}a".format(*torch.cuda.get_device_capability())
            if torch.cuda.is_available()
            else "sm_90a"
        )
    if not gpu and not args.compile_only:
        print("no CUDA device: compiling only (--compile-only)")

    t0 = time.perf_counter()
    compiled = compile_all(shapes, arch, only)
    compile_s = time.perf_counter() - t0
    print_compile(compiled, arch)
    print(
        f"compiled {sum(len(v) for v in compiled.values())} variants for {arch} in {compile_s:.1f} s"
    )
    failed = [
        f"{m}x{n} {k}"
        for (m, n), v in compiled.items()
        for k, r in v.items()
        if "error" in r
    ]

    report = {
        "device": device_info(),
        "arch": arch,
        "compile_s": compile_s,
        "compile_only": not gpu,
        "command": " ".join(sys.argv),
    }
    if gpu:
        report.update(run_gpu(compiled, args.rounds, args.min_iters, args.inductor_code))
    else:
        report["shapes"] = {
            f"{m}x{n}": {
                "m": m,
                "n": n,
                "impls": {
                    k: {kk: vv for kk, vv in r.items() if kk != "fn"}
                    for k, r in v.items()
                },
            }
            for (m, n), v in compiled.items()
        }
    report["wall_s"] = time.perf_counter() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.out}")
    bad = failed + [
        f"{s} {k}"
        for s, v in report.get("shapes", {}).items()
        for k, r in v["impls"].items()
        if r.get("passed") is False
    ]
    if bad:
        print("FAILED: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
