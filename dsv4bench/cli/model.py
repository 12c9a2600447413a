"""`dsv4bench make-checkpoint` and `dsv4bench run-model`: the reference model runner."""

from __future__ import annotations

import os
import time
import unicodedata
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dsv4bench.cli.checkpoints import resolve_checkpoint, synthetic_checkpoint
from dsv4bench.cli.common import SEED_MAX, check_output, check_range, console, fail, writing
from dsv4bench.cli.model_speed import bench_model_cmd


def make_checkpoint_cmd(
    config: str = typer.Option(..., "--config", help="tiny | flash | pro"),
    out: Path = typer.Option(..., "--out", help="directory to create (must not hold a checkpoint)"),
    seed: int = typer.Option(0, "--seed", help="seed of the random weights"),
    expert_dtype: str = typer.Option("fp4", "--expert-dtype", help="fp4 (official MXFP4) | nvfp4"),
) -> None:
    """Write random weights in exactly the official HF safetensors layout, plus config.json."""
    from dsv4bench.model.config import EXPERT_DTYPES, ConfigError, get_config
    from dsv4bench.model.inventory import expected_tensors
    from dsv4bench.model.synth import SynthError, write_checkpoint

    try:
        cfg = get_config(config)
    except ConfigError as e:
        fail(str(e))
    if expert_dtype not in EXPERT_DTYPES:
        fail(f"unknown --expert-dtype {expert_dtype!r}; choose one of {', '.join(EXPERT_DTYPES)}")
    check_range("--seed", seed, 0, SEED_MAX)
    check_output("--out", out, directory=True)
    cfg = cfg.with_(expert_dtype=expert_dtype)
    inv = expected_tensors(cfg)
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"writing {cfg.name}", total=cfg.n_layers + cfg.n_mtp_layers + 1)
        try:
            with writing(f"the checkpoint to {out}"):
                write_checkpoint(cfg, out, seed, progress=lambda unit, i, n: bar.update(task, completed=i,
                                                                                      description=unit))
        except SynthError as e:
            fail(str(e))
    table = Table(title=f"checkpoint {cfg.name}", show_header=False)
    table.add_row("tensors", f"{len(inv):,}")
    table.add_row("shards", str(len(list(out.glob('*.safetensors')))))
    table.add_row("bytes", f"{sum(s.nbytes for s in inv.values()):,}")
    table.add_row("experts", expert_dtype)
    table.add_row("seconds", f"{time.perf_counter() - t0:.1f}")
    console.print(table)
    console.print(f"wrote {out}")


def printable(text: str) -> str:
    """`text` safe for a terminal: control and format characters (ESC, CR, BEL, bidi overrides...,
    which the byte-level tokenizer of a random model emits freely) written as repr-style escapes
    (\\x1b, \\u202e); newline and tab kept."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co")
                   else repr(c)[1:-1] for c in text)


def show_serving(backend: str, runs_here: bool) -> None:
    """Which kernel serves each model op under `backend` (and which ops stay on their oracle)."""
    from dsv4bench.model.dispatch import serving_table

    rows = serving_table(backend)
    table = Table(title=f"--backend {backend}: " + ("what serves each op" if runs_here else
                  "what would serve each op on a GPU (this run: --device cpu, every op on its oracle)"))
    table.add_column("op")
    table.add_column("served by")
    for op, by in rows:
        table.add_row(op, by if not by.startswith("oracle") else f"[dim]{by}[/]")
    console.print(table)
    served = sum(not by.startswith("oracle") for _, by in rows)
    console.print(f"{served} of {len(rows)} ops on {backend}; the rest run their FP32 oracle", highlight=False)


def _selected_ops(backend: str, device: str):
    """The op table of the run; prints what serves each op under a backend other than the oracle."""
    from dsv4bench.model.dispatch import DispatchError, OpTable, register_kernel_ops
    from dsv4bench.model.kernel_ops import KERNEL
    from dsv4bench.model.lowprec_ops import register_lowprec_ops

    if backend == "oracle":
        return OpTable()
    register_kernel_ops()
    register_lowprec_ops()
    runs_here = device == "cuda" or backend != KERNEL  # CuTeDSL kernels need a GPU: on the CPU their ops
    show_serving(backend, runs_here)                     # stay on the oracle (other backends run anywhere)
    try:
        selected = OpTable().select_all(backend)  # an unknown backend is an error on any device
    except DispatchError as e:
        fail(str(e))
    return selected if runs_here else OpTable()


def _stream(engine, tok, prompts: list[list[int]], texts: list[str], max_new_tokens: int, temperature: float,
            seed: int) -> tuple[list[list[int]], float, float, float]:
    """Generate; one prompt streams its text, a batch prints each completion at the end.
    Returns (new tokens per prompt, start, first-token and end times)."""
    single = len(prompts) == 1
    if single:
        console.print(printable(texts[0]), end="", markup=False, highlight=False, soft_wrap=True)
    new: list[list[int]] = [[] for _ in prompts]
    shown, first = "", None
    t0 = time.perf_counter()
    for b, t, _ in engine.generate_batch(prompts, max_new_tokens, temperature, seed):
        if first is None:
            first = time.perf_counter()
        new[b].append(t)
        if single:
            text = tok.decode(new[0])
            if not text.endswith("\ufffd"):
                console.print(printable(text[len(shown):]), end="", markup=False, highlight=False, soft_wrap=True)
                shown = text
    end = time.perf_counter()
    if single:
        console.print(printable(tok.decode(new[0])[len(shown):]), markup=False, highlight=False, soft_wrap=True)
    else:
        for i, (text, toks) in enumerate(zip(texts, new)):
            console.print(f"[{i}] " + printable(text + tok.decode(toks)), markup=False, highlight=False,
                          soft_wrap=True)
    return new, t0, first, end


def run_model_cmd(
    prompt: list[str] = typer.Option(..., "--prompt", help="text to continue; repeat it for a batch of prompts "
                                                           "(the official generate loop's left-aligned batch)"),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="HF safetensors checkpoint directory"),
    config: Optional[str] = typer.Option(None, "--config", help="tiny (the embedded checkpoint), or flash / pro: "
                                                              "random weights in the official formats drawn on "
                                                              "--device at the production widths, nothing on disk"),
    layers: Optional[int] = typer.Option(None, "--layers", help="with --config flash|pro: the first N layers "
                                                               "(4 of Flash hold every layer kind) + the MTP block"),
    weights_seed: int = typer.Option(0, "--weights-seed", help="with --config flash|pro: the weights' seed"),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="tokens to generate (per prompt)"),
    temperature: float = typer.Option(0.6, "--temperature", help="0 = greedy"),
    seed: int = typer.Option(0, "--seed", help="sampler seed (every prompt of a batch samples as if alone)"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    backend: str = typer.Option("oracle", "--backend", help="op backend: oracle, cutedsl (every op a kernel "
                                                           "family serves; the others run their oracle), or "
                                                           "lowprec (the ops' low-precision torch references)"),
    qat: str = typer.Option("on", "--qat", help="on | off: the official model's FP8 KV and FP4 indexer round trips"),
    threads: int = typer.Option(1, "--threads", help="CPU threads for torch, 1..the CPU count (tiny models "
                                                      "run best on 1)"),
    compare: bool = typer.Option(False, "--compare", help="diff --backend against the FP32 oracle model per layer "
                                                         "and op, teacher-forced on the oracle's greedy tokens"),
    bisect: bool = typer.Option(False, "--bisect", help="switch one op at a time to --backend and name the first "
                                                       "op whose error jumps"),
) -> None:
    """Generate from a checkpoint through the FP32 oracles (or registered kernels), streaming tokens."""
    import torch

    from dsv4bench.model.engine import Engine
    from dsv4bench.model.loader import Checkpoint, CheckpointError
    from dsv4bench.model.tokenizer import load_tokenizer

    check_range("--max-new-tokens", max_new_tokens, 1)
    check_range("--temperature", temperature, 0)
    check_range("--seed", seed, 0, SEED_MAX)
    check_range("--weights-seed", weights_seed, 0, SEED_MAX)
    check_range("--threads", threads, 1, os.cpu_count() or 1)
    if device not in ("cpu", "cuda"):
        fail(f"unknown --device {device!r}; choose cpu or cuda")
    if qat not in ("on", "off"):
        fail(f"unknown --qat {qat!r}; choose on or off")
    if (compare or bisect) and len(prompt) > 1:
        fail("--compare and --bisect take one --prompt")
    if bisect and backend == "oracle":
        fail("--bisect needs a --backend to bisect (cutedsl, or one a plugin registered)")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA GPU is visible")
    if device == "cpu":
        torch.set_num_threads(threads)
    ops = _selected_ops(backend, device)
    if bisect and all(be == "oracle" for be in ops.active.values()):
        fail(f"--bisect: no op runs on {backend!r} here (the cutedsl kernels need --device cuda)")
    path = resolve_checkpoint(checkpoint, config)
    if layers is not None and path is not None:
        fail("--layers takes --config flash or pro (a synthetic checkpoint)")
    t0 = time.perf_counter()
    try:
        with console.status(f"opening {path or config}") as status:
            ckpt = Checkpoint.open(path) if path is not None else synthetic_checkpoint(config, layers, weights_seed, device)
            engine = Engine(ckpt, device=device, ops=ops, qat=qat == "on",
                            progress=lambda unit: status.update(f"loaded {unit}"))
    except CheckpointError as e:
        fail(str(e))
    load_s = time.perf_counter() - t0
    tok = load_tokenizer(ckpt.config, path)
    try:
        prompts = [tok.encode(p) for p in prompt]
    except ValueError as e:  # ids beyond the model's vocab
        fail(str(e))
    limit = ckpt.config.max_position_embeddings
    longest = max(map(len, prompts))
    if longest + max_new_tokens > limit:
        fail(f"{longest} prompt + {max_new_tokens} new tokens exceed max_position_embeddings={limit}")
    source = path if path is not None else f"synthetic weights (seed {weights_seed}, {ckpt.config.n_layers} layers)"
    console.print(f"[dim]{ckpt.config.name} from {source} · {tok.name} tokenizer · "
                  f"{', '.join(str(len(p)) for p in prompts)} prompt tokens · {device} · qat {qat} · "
                  f"loaded in {load_s:.2f} s[/]", highlight=False, soft_wrap=True)
    new, t0, first, end = _stream(engine, tok, prompts, prompt, max_new_tokens, temperature, seed)
    total = sum(map(len, new))
    summary = Table(title="run-model", show_header=False)
    summary.add_row("prompt tokens", ", ".join(str(len(p)) for p in prompts))
    summary.add_row("new tokens", ", ".join(str(len(n)) for n in new))
    summary.add_row("prefill (time to first token)", f"{first - t0:.3f} s")
    summary.add_row("decode", f"{(total - 1) / (end - first):.1f} tokens/s" if total > 1 else "-")
    summary.add_row("overall", f"{total / (end - t0):.1f} tokens/s")
    summary.add_row("cache", f"{engine.cache_bytes():,} bytes")
    console.print(summary)
    ops_table = Table(title="ops")
    for col in ("op", "backend", "calls", "seconds"):
        ops_table.add_column(col, justify="right" if col in ("calls", "seconds") else "left")
    for op, be, calls, secs in ops.report():
        if op in ops.refused:
            n, why = ops.refused[op]
            be = f"{be}, oracle for {n} of {calls} calls ({why})"
        ops_table.add_row(op, be, str(calls), f"{secs:.3f}")
    console.print(ops_table)
    if compare:
        _compare(engine, ops, prompts[0], max_new_tokens, backend)
    if bisect:
        _bisect(engine, backend, prompts[0], max_new_tokens)


def _compare(engine, ops, prompt: list[int], steps: int, backend: str) -> None:
    from dsv4bench.cli.model_diff import show_compare
    from dsv4bench.model.diff import compare
    from dsv4bench.model.error import DiffError

    from dsv4bench.model.dispatch import OpTable
    from dsv4bench.model.lowprec_ops import LOWPREC

    bound = None
    if backend not in ("oracle", LOWPREC):  # the low-precision torch model beside it: the error it is held to
        low = OpTable().select_all(LOWPREC)
        bound = (dict(low.active), low.stream_dtype)
    with console.status("--compare: the oracle model, the candidate and the low-precision model, teacher-forced"):
        try:
            report = compare(engine, dict(ops.active), prompt, steps, ops.stream_dtype, bound=bound)
        except DiffError as e:
            fail(f"--compare: {e}")
    show_compare(report, backend)


def _bisect(engine, backend: str, prompt: list[int], steps: int) -> None:
    from dsv4bench.cli.model_diff import show_bisect
    from dsv4bench.model.bisect import JUMP_FACTOR, bisect
    from dsv4bench.model.error import DiffError

    with console.status(f"--bisect: one op at a time on {backend}"):
        try:
            verdicts, named = bisect(engine, backend, prompt, steps)
        except DiffError as e:
            fail(f"--bisect: {e}")
    show_bisect(verdicts, named, backend, JUMP_FACTOR)


def register(app: typer.Typer) -> None:
    app.command("make-checkpoint")(make_checkpoint_cmd)
    app.command("run-model")(run_model_cmd)
    app.command("bench-model")(bench_model_cmd)
