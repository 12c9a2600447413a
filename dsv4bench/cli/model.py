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

from dsv4bench.cli.common import SEED_MAX, check_output, check_range, console, fail, writing


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


def _resolve_checkpoint(checkpoint: Optional[Path], config: Optional[str]) -> Path:
    from dsv4bench.model.config import CONFIGS

    if checkpoint is not None:
        if config is not None:
            fail("pass either --checkpoint or --config, not both")
        return checkpoint
    name = config or "tiny"
    if name not in CONFIGS:
        fail(f"unknown config {name!r}; choose one of {', '.join(CONFIGS)}")
    if name != "tiny":
        fail(f"there is no embedded {name} checkpoint; write one with `dsv4bench make-checkpoint "
             f"--config {name} --out DIR` and pass --checkpoint DIR")
    from dsv4bench.model.default import cache_dir, default_checkpoint

    with console.status(f"embedded tiny checkpoint ({cache_dir()})"):
        return default_checkpoint()


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
    console.print(f"{served} of {len(rows)} ops served by kernels; the rest run their FP32 oracle", highlight=False)


def run_model_cmd(
    prompt: str = typer.Option(..., "--prompt", help="text to continue"),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="HF safetensors checkpoint directory"),
    config: Optional[str] = typer.Option(None, "--config", help="embedded checkpoint to use (tiny)"),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="tokens to generate"),
    temperature: float = typer.Option(0.6, "--temperature", help="0 = greedy"),
    seed: int = typer.Option(0, "--seed", help="sampler seed"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    backend: str = typer.Option("oracle", "--backend", help="op backend: oracle, or cutedsl (every op a kernel "
                                                           "family serves; the others run their oracle)"),
    threads: int = typer.Option(1, "--threads", help="CPU threads for torch, 1..the CPU count (tiny models "
                                                      "run best on 1)"),
    compare: bool = typer.Option(False, "--compare", help="diff every step's logits against the FP32 oracles"),
) -> None:
    """Generate from a checkpoint through the FP32 oracles (or registered kernels), streaming tokens."""
    import torch

    from dsv4bench.model.dispatch import DispatchError, OpTable, register_kernel_ops
    from dsv4bench.model.kernel_ops import KERNEL
    from dsv4bench.model.engine import Engine, compare_to_oracle
    from dsv4bench.model.loader import Checkpoint, CheckpointError
    from dsv4bench.model.tokenizer import load_tokenizer

    check_range("--max-new-tokens", max_new_tokens, 1)
    check_range("--temperature", temperature, 0)
    check_range("--seed", seed, 0, SEED_MAX)
    check_range("--threads", threads, 1, os.cpu_count() or 1)
    if device not in ("cpu", "cuda"):
        fail(f"unknown --device {device!r}; choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA GPU is visible")
    if device == "cpu":
        torch.set_num_threads(threads)
    ops = OpTable()
    if backend != "oracle":
        register_kernel_ops()
        show_serving(backend, runs_here=device == "cuda" or backend != KERNEL)
        try:
            selected = OpTable().select_all(backend)  # an unknown backend is an error on any device
        except DispatchError as e:
            fail(str(e))
        if device == "cuda" or backend != KERNEL:  # CuTeDSL kernels need a GPU: on the CPU their ops
            ops = selected                           # stay on the oracle (other backends run anywhere)
    path = _resolve_checkpoint(checkpoint, config)
    t0 = time.perf_counter()
    try:
        with console.status(f"opening {path}") as status:
            ckpt = Checkpoint.open(path)
            engine = Engine(ckpt, device=device, ops=ops, progress=lambda unit: status.update(f"loaded {unit}"))
    except CheckpointError as e:
        fail(str(e))
    load_s = time.perf_counter() - t0
    tok = load_tokenizer(ckpt.config, path)
    try:
        ids = tok.encode(prompt)
    except ValueError as e:  # ids beyond the model's vocab
        fail(str(e))
    limit = ckpt.config.max_position_embeddings
    if len(ids) + max_new_tokens > limit:
        fail(f"{len(ids)} prompt + {max_new_tokens} new tokens exceed max_position_embeddings={limit}")
    console.print(f"[dim]{ckpt.config.name} from {path} · {tok.name} tokenizer · {len(ids)} prompt tokens · "
                  f"{device} · loaded in {load_s:.2f} s[/]", highlight=False, soft_wrap=True)
    console.print(printable(prompt), end="", markup=False, highlight=False, soft_wrap=True)
    new: list[int] = []
    steps = []
    shown = ""
    t0 = time.perf_counter()
    first = None
    for t, step in engine.generate(ids, max_new_tokens, temperature, seed):
        first = first or time.perf_counter()
        new.append(t)
        if compare:
            steps.append(step)
        text = tok.decode(new)
        if not text.endswith("\ufffd"):
            console.print(printable(text[len(shown):]), end="", markup=False, highlight=False, soft_wrap=True)
            shown = text
    end = time.perf_counter()
    console.print(printable(tok.decode(new)[len(shown):]), markup=False, highlight=False, soft_wrap=True)
    decode_n = len(new) - 1
    summary = Table(title="run-model", show_header=False)
    summary.add_row("prompt tokens", str(len(ids)))
    summary.add_row("new tokens", str(len(new)))
    summary.add_row("prefill (time to first token)", f"{first - t0:.3f} s")
    summary.add_row("decode", f"{decode_n / (end - first):.1f} tokens/s" if decode_n else "-")
    summary.add_row("overall", f"{len(new) / (end - t0):.1f} tokens/s")
    summary.add_row("cache", f"{engine.cache_bytes():,} bytes")
    if compare:
        errs = compare_to_oracle(ckpt, device, ids + new, steps)
        worst = max(range(len(errs)), key=errs.__getitem__)
        summary.add_row("vs FP32 oracle (max rel logits)", f"{errs[worst]:.2e} at new token {worst}")
    console.print(summary)
    ops_table = Table(title="ops")
    for col in ("op", "backend", "calls", "seconds"):
        ops_table.add_column(col, justify="right" if col in ("calls", "seconds") else "left")
    for op, be, calls, secs in ops.report():
        ops_table.add_row(op, be, str(calls), f"{secs:.3f}")
    console.print(ops_table)


def register(app: typer.Typer) -> None:
    app.command("make-checkpoint")(make_checkpoint_cmd)
    app.command("run-model")(run_model_cmd)
