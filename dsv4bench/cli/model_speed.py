"""`dsv4bench bench-model`: end-to-end prefill and decode speed of one backend against others, in
one process on the same weights (dsv4bench/model/speed.py; docs/perf/model.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from dsv4bench.cli.checkpoints import resolve_checkpoint, synthetic_checkpoint
from dsv4bench.cli.common import SEED_MAX, check_output, check_range, console, fail, writing
from dsv4bench.core.environment import git_commit

RESULTS = "results.jsonl"


def bench_model_cmd(
    config: Optional[str] = typer.Option("flash", "--config", help="flash / pro (synthetic, on --device) or tiny"),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="HF safetensors checkpoint directory "
                                                                         "instead of --config"),
    layers: Optional[int] = typer.Option(4, "--layers", help="with --config flash|pro: the first N layers + MTP"),
    weights_seed: int = typer.Option(0, "--weights-seed", help="with --config flash|pro: the weights' seed"),
    prefill: int = typer.Option(4096, "--prefill", help="prompt tokens per sequence (N)"),
    decode: int = typer.Option(128, "--decode", help="greedy decode steps after the prefill (D)"),
    batch: int = typer.Option(1, "--batch", help="sequences at once (B)"),
    backends: str = typer.Option("cutedsl,lowprec", "--backends", help="comma-separated; the first is measured "
                                                                       "against each of the others"),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu"),
    qat: str = typer.Option("on", "--qat", help="on | off"),
    seed: int = typer.Option(0, "--seed", help="the prompt tokens' seed"),
    out: Path = typer.Option(..., "--out", help="directory for results.jsonl (appended)"),
) -> None:
    """Prefill N tokens and decode D steps at batch B on each backend; per-op time table and speedups."""
    import torch

    from dsv4bench.model.dispatch import DispatchError, register_kernel_ops
    from dsv4bench.model.engine import Engine
    from dsv4bench.model.loader import Checkpoint, CheckpointError
    from dsv4bench.model.lowprec_ops import register_lowprec_ops
    from dsv4bench.model.speed import TimedTable, Clock, measure, speedups

    for name, value, low in (("--prefill", prefill, 1), ("--decode", decode, 1), ("--batch", batch, 1)):
        check_range(name, value, low)
    check_range("--seed", seed, 0, SEED_MAX)
    names = [b for b in backends.split(",") if b]
    if len(names) < 2 or len(set(names)) != len(names):
        fail("--backends takes at least two different backends, e.g. cutedsl,lowprec")
    if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_available()):
        fail(f"--device {device}: choose cpu, or cuda with a visible GPU")
    if qat not in ("on", "off"):
        fail(f"unknown --qat {qat!r}; choose on or off")
    check_output("--out", out, directory=True)
    register_kernel_ops()
    register_lowprec_ops()
    clock = Clock(device == "cuda")
    try:
        tables = {b: TimedTable(clock).select_all(b) if b != "oracle" else TimedTable(clock) for b in names}
    except DispatchError as e:
        fail(str(e))
    path = resolve_checkpoint(checkpoint, config)
    try:
        ckpt = Checkpoint.open(path) if path is not None else synthetic_checkpoint(config, layers, weights_seed, device)
    except CheckpointError as e:
        fail(str(e))
    cfg = ckpt.config
    if prefill + decode > cfg.max_position_embeddings:
        fail(f"--prefill {prefill} + --decode {decode} exceed max_position_embeddings={cfg.max_position_embeddings}")
    with console.status(f"loading {cfg.name}"):
        engine = Engine(ckpt, device=device, qat=qat == "on")
    ids = torch.randint(2, cfg.vocab_size, (batch, prefill), generator=torch.Generator().manual_seed(seed)).to(device)
    meta = {"config": cfg.name, "layers": cfg.n_layers, "prefill": prefill, "decode": decode, "batch": batch,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "qat": qat,
            "commit": git_commit() or "unknown"}
    results = []
    for b in names:
        with console.status(f"{b}: warm-up, then prefill {batch} x {prefill} and {decode} decode steps"):
            results += measure(engine, tables[b], b, ids, decode)
    records = [r.record(meta) for r in results] + speedups(results, meta)
    out.mkdir(parents=True, exist_ok=True)
    with writing(str(out / RESULTS)), open(out / RESULTS, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    _show(results, records, names)
    console.print(f"wrote {out / RESULTS}", highlight=False)


def _show(results, records, names: list[str]) -> None:
    by = {(r.backend, r.phase): r for r in results}
    for phase in ("prefill", "decode"):
        table = Table(title=f"{phase}: ms per op (share of the phase)")
        table.add_column("op")
        for b in names:
            table.add_column(b, justify="right")
        table.add_column(f"{names[1]} / {names[0]}", justify="right")
        ops = list(dict.fromkeys(op for b in names for op in by[(b, phase)].ops))
        for op in ops:
            cells = []
            for b in names:
                r = by[(b, phase)]
                ms = r.ops.get(op, (0, 0.0))[1]
                cells.append(f"{ms:.2f} ({ms / (1e3 * r.seconds):.0%})")
            a, z = by[(names[0], phase)].ops.get(op, (0, 0.0))[1], by[(names[1], phase)].ops.get(op, (0, 0.0))[1]
            table.add_row(op, *cells, f"{z / a:.2f}x" if a > 0 else "-")
        table.add_row("[bold]total[/]", *[f"{1e3 * by[(b, phase)].seconds:.2f} "
                                         f"({by[(b, phase)].tokens / by[(b, phase)].seconds:.1f} tok/s)" for b in names],
                      "")
        console.print(table)
    for r in (r for r in records if r["kind"] == "speedup"):
        console.print(f"{r['phase']}: {r['backend']} is {r['speedup']:.2f}x {r['baseline']}", highlight=False)
