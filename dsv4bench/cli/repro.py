"""`dsv4bench repro CASE_ID`: replay one case with full diagnostics."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path
from typing import Iterator, Optional

import torch
import typer
from rich.markup import escape
from rich.table import Table

from dsv4bench.cli.common import console, fail, gpu_arch
from dsv4bench.core.case import Case
from dsv4bench.core.compare import compare_outputs
from dsv4bench.core.evaluate import CaseData, Outcome, evaluate
from dsv4bench.core.regressions import regressions_dir
from dsv4bench.core.registry import Impl, broken_note, get_family, impls
from dsv4bench.core.results import PASS, UNCHECKED, UNSUPPORTED, RunDir, read_csv
from dsv4bench.core.runner import CHECK_IMPL
from dsv4bench.core.worker import Worker
from dsv4bench.report.rundata import NotARunDir, read_meta

WORST = 8


Found = tuple[Case, Path, str]  # the case, where it was found, the command that made it


RESULT_FILES = ("run.json", "results.jsonl", "results.jsonl.gz", "results.csv")  # what makes a directory a run directory


def _case_in_meta(run: RunDir, case_id: str) -> Found | None:
    """The case as run.json records it, None when it is not there; NotARunDir (naming the file)
    when the file or the case's entry cannot be read."""
    d = read_meta(run)
    cases = d.get("cases") or {}
    if not isinstance(cases, dict):
        raise NotARunDir(f"{run.meta}: 'cases' is a JSON {type(cases).__name__}, not an object")
    if case_id not in cases:
        return None
    try:
        return Case.from_json(cases[case_id]), run.path, d.get("command", "?")
    except (KeyError, TypeError, ValueError) as e:
        raise NotARunDir(f"{run.meta}: case {case_id} is malformed ({type(e).__name__}: {e})") from None


def _case_in_records(run: RunDir, case_id: str) -> Found | None:
    """The case rebuilt from its result records (every parameter and the seed are in each), for a
    directory without run.json: results.jsonl(.gz), else results.csv."""
    source = next((p for p in (run.results, run.archive) if p.exists()), run.csv)
    try:
        records = run.records() if source != run.csv else read_csv(run.csv)
    except (OSError, csv.Error, KeyError, TypeError, ValueError) as e:
        raise NotARunDir(f"{source}: cannot read its records ({type(e).__name__}: {e})") from None
    r = next((r for r in records if r.case_id == case_id), None)
    if r is None:
        return None
    return (Case(r.family, r.params, int(r.seed), r.origin or "grid"), run.path,
            f"unknown: no run.json, so the run's metadata (command, environment) is absent; "
            f"case rebuilt from {source.name}")


def _case_in_run(path: Path, case_id: str) -> Found | None:
    run = RunDir(path)
    return _case_in_meta(run, case_id) if run.meta.exists() else _case_in_records(run, case_id)


def _run_dirs(roots: list[Path]) -> list[Path]:
    """Directories under `roots` (each root included) holding run.json or only result files,
    newest first."""
    newest: dict[Path, float] = {}
    for root in roots:
        for name in RESULT_FILES if root.exists() else ():
            for p in root.rglob(name):
                newest[p.parent] = max(newest.get(p.parent, 0.0), p.stat().st_mtime)
    return sorted(newest, key=newest.__getitem__, reverse=True)


def _case_in_regressions(path: Path, case_id: str, skipped: list[str]) -> Found | None:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line) if line.strip() else {}
            if entry.get("case_id") == case_id:
                case = Case(path.stem, entry["params"], int(entry.get("seed", 0)), "regression")
                return case, path, f"{entry.get('command', '?')}  ({entry.get('status')} at {entry.get('commit')})"
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            skipped.append(f"{path} line {n}: {type(e).__name__}: {e}")
    return None


def _recordings(case_id: str, roots: list[Path], skipped: list[str]) -> Iterator[Found]:
    """Where the case is recorded: run directories under `roots` (newest first), then the
    regression files; what cannot be read is skipped and noted in `skipped`."""
    for path in _run_dirs(roots):
        try:
            found = _case_in_run(path, case_id)
        except NotARunDir as e:
            skipped.append(str(e))
            continue
        if found:
            yield found
    for path in sorted(regressions_dir().glob("*.jsonl")):
        found = _case_in_regressions(path, case_id, skipped)
        if found:
            yield found


def find_case(case_id: str, roots: list[Path]) -> Found:
    """The newest recording of the case; unreadable run.json files and regression lines on the way
    are skipped, and named."""
    skipped: list[str] = []
    found = next(_recordings(case_id, roots, skipped), None)
    if found is None:
        also = f"; skipped {len(skipped)} unreadable, first {skipped[0]}" if skipped else ""
        fail(f"case '{case_id}' not found in any run directory under {', '.join(map(str, roots))} "
             f"nor in the regression files in {regressions_dir()}{also}")
    for why in skipped:
        console.print(f"[yellow]skipped[/] {escape(why)}", highlight=False, soft_wrap=True)
    return found


def error_histogram(out: torch.Tensor, ref: torch.Tensor) -> list[tuple[str, int]]:
    err = (out.double() - ref.double()).abs().flatten()
    edges = [0.0] + [10.0**e for e in range(-8, 2)] + [float("inf")]
    return [(f"[{lo:.0e}, {hi:.0e})", int(((err >= lo) & (err < hi)).sum())) for lo, hi in zip(edges, edges[1:])]


def show_worst(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor | None) -> None:
    diff = (out.double() - ref.double()).abs().nan_to_num(float("inf")).flatten()
    k = min(WORST, diff.numel())
    table = Table(title=f"{name}: worst {k} elements")
    for col in ("coordinates", "out", "oracle", "lowprec", "|out-oracle|"):
        table.add_column(col)
    for flat in torch.topk(diff, k).indices.tolist():
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), out.shape))
        table.add_row(str(list(idx)), f"{float(out[idx]):.6g}", f"{float(ref[idx]):.6g}",
                      f"{float(low[idx]):.6g}" if low is not None else "", f"{float(diff[flat]):.3g}")
    console.print(table)
    hist = Table(title=f"{name}: |out - oracle| histogram")
    hist.add_column("bucket")
    hist.add_column("elements")
    for bucket, n in error_histogram(out, ref):
        if n:
            hist.add_row(bucket, str(n))
    console.print(hist)


def show_outcome(label: str, outcome: Outcome, data: CaseData) -> bool:
    ok = outcome.passed
    colour = {PASS: "green", UNCHECKED: "yellow", UNSUPPORTED: "yellow"}.get(outcome.status, "red")
    console.print(f"[{colour}]{label}: {outcome.status}[/]" + ("" if ok else f" {outcome.reason}"), highlight=False)
    for name, m in outcome.metrics.items():
        console.print(f"  {name}: max {m.max_abs:.4g} mean {m.mean_abs:.4g} rel_l2 {m.rel_l2:.3g} "
                      f"bound {m.bound} worst at {m.worst_index}" + ("" if ok else f"; {m.summary()}"))
        res = outcome.result.get(name)
        if res is not None and res.is_floating_point():
            show_worst(name, res.cpu(), data.oracle[name].cpu(),
                       data.lowprec[name].cpu() if name in data.lowprec else None)
    return ok or outcome.status == UNSUPPORTED


def show_reference_check(data: CaseData, tol) -> bool:
    """What a CPU sweep checks: the low-precision reference against the FP32 oracle."""
    ok, metrics = compare_outputs(data.lowprec, data.oracle, data.lowprec, tol)
    outcome = Outcome(PASS if ok else "FAIL_NUMERIC", "; ".join(m.summary() for m in metrics.values()),
                      metrics, data.lowprec)
    return show_outcome("lowprec reference vs FP32 oracle (CPU check)", outcome, data)


def plan_impls(case: Case, impl: str | None, arch: str | None) -> list[tuple[Impl, str | None]]:
    """The impls to replay (--impl, else the family's non-variant ones), each with why it cannot
    run here (None: it runs, or without a GPU compiles for each arch)."""
    known = impls(case.family, variants=True)
    chosen = [im for im in known if (im.name == impl if impl else not im.variant)]
    if impl and not chosen and impl != CHECK_IMPL:
        fail(f"--impl: family {case.family} has no impl '{impl}' (impls: {', '.join(i.name for i in known)})"
             f"{broken_note(case.family)}")

    def why_not(im: Impl) -> str | None:
        if not arch and im.compiles:
            return None
        if not arch and im.needs_gpu:
            return "needs a GPU"
        return im.available() or im.supports(case, arch)

    return [(im, why_not(im)) for im in chosen]


def repro_cmd(
    case_id: str = typer.Argument(..., help="a case id from a sweep's results"),
    runs: Optional[Path] = typer.Option(None, help="run directory root to search (default: reports/)"),
    impl: Optional[str] = typer.Option(None, help="only this impl"),
) -> None:
    """Replay one case: inputs regenerated from its seed, every impl compared with diagnostics.
    Exit status 1 when any comparison fails, 2 when nothing can be compared here."""
    case, found, made_by = find_case(case_id, [runs] if runs else [Path("reports")])
    try:
        family = get_family(case.family)
    except KeyError as e:
        fail(e.args[0])
    arch = gpu_arch()
    check = not arch and impl in (None, CHECK_IMPL)  # the CPU check: lowprec reference vs oracle
    planned = plan_impls(case, impl, arch)
    if not check and all(why for _, why in planned):
        why = "; ".join(f"{im.name} {why}" for im, why in planned) or f"family {case.family} has no impl '{impl}'"
        fail(f"nothing to compare for {case_id} on this machine: {why}")
    replay = ["dsv4bench", "repro", case_id] + (["--runs", str(runs.resolve())] if runs else [])
    console.print(f"[bold]{escape(str(case))}[/]\nfound in: {escape(str(found))}\nmade by:  {escape(made_by)}\n"
                  f"replay:   {escape(shlex.join(replay + (['--impl', impl] if impl else [])))}", highlight=False)
    worker = Worker()
    device = "cuda" if arch else "cpu"
    data = CaseData(family, case, device)
    tol = lambda n: family.tolerance_for(case, n)  # noqa: E731
    passed = show_reference_check(data, tol) if check else True
    for im, why in planned:
        if why:
            console.print(f"{im.name}: UNSUPPORTED ({why})", highlight=False)
        elif not arch and im.compiles:  # for each arch, on fake tensors
            passed &= show_compiles(worker, im, case)
        else:
            compiled = worker.cache.get(im, case, arch)[0] if im.compiles else None
            passed &= show_outcome(im.name, evaluate(family, im, case, compiled, device=device, data=data), data)
    if not passed:
        raise typer.Exit(1)


def show_compiles(worker: Worker, im: Impl, case: Case) -> bool:
    ok = True
    for a in im.archs:
        try:
            info = worker.cache.get(im, case, a)[1]
            console.print(f"{im.name} {a}: COMPILED in {info.seconds:.2f}s, {info.registers} registers, "
                          f"{info.local_bytes} B local, {info.cubin_bytes} B cubin")
        except Exception as e:
            console.print(f"[red]{im.name} {a}: FAIL_COMPILE[/] {type(e).__name__}: {e}")
            ok = False
    return ok


def register(app: typer.Typer) -> None:
    app.command("repro")(repro_cmd)
