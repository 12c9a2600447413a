#!/usr/bin/env python3
"""Copy a GPU run into the results dataset: benchmarks/results/<family>/<date>-<device>-<commit7>[-<tag>]/.

Each run directory of the dataset holds `results.jsonl.gz` (JSON Lines, one object per line,
gzipped: a tenth of the bytes every device call carries; `zcat ... | jq`, and `dsv4bench report` /
`RunDir.records` read it as they read results.jsonl) and a README.md
with the command, commit, device and date; a sweep run also keeps a compact `run.json` (what
`dsv4bench report DIR` reads: command, kernel, seed, examples, archs, gpu, started, environment),
so `dsv4bench report DIR` re-renders index.html and results.csv from it (both git-ignored there).
Logs, HTML and generated code are not copied. benchmarks/results/INDEX.md lists the runs.

    python3 benchmarks/save_run.py RUN_DIR --family F --commit C --device h100          # a `dsv4bench sweep` run
    python3 benchmarks/save_run.py OUT.json --json --family F --commit C --device h100   # fmha_bench / *_probe JSON
    python3 benchmarks/save_run.py gpu-tests.xml --junit --commit C --device h100       # pytest --junitxml, per family

A sweep run with results.csv but no results.jsonl (an old one) is converted losslessly
(`dsv4bench.core.results.read_csv`). `--command` records how a JSON or junit run was made;
`--backs` says which figure the run backs; `--note` adds a line (repeatable). Prints each
directory it writes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"
KERNELS = Path(__file__).resolve().parent.parent / "kernels"
META_KEYS = ("command", "kernel", "seed", "examples", "archs", "gpu", "started", "environment")


def commit7(commit: str) -> str:
    c = commit.strip().removesuffix("-dirty")
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", c):
        raise SystemExit(f"save_run: commit {commit!r} is not a git hash")
    return c[:7].lower()


def run_dir_name(date: str, device: str, commit: str, tag: str = "") -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise SystemExit(f"save_run: date {date!r} is not YYYY-MM-DD")
    if not re.fullmatch(r"[a-z0-9]+", device):
        raise SystemExit(f"save_run: device {device!r}: lower-case letters and digits (h100, b200)")
    if tag and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", tag):
        raise SystemExit(f"save_run: tag {tag!r}: lower-case letters, digits and '-'")
    return f"{date}-{device}-{commit7(commit)}" + (f"-{tag}" if tag else "")


def compact_meta(meta: dict) -> dict:
    """run.json without the case table and the per-invocation copies (the report reads neither)."""
    out = {k: meta[k] for k in META_KEYS if k in meta}
    invocations = meta.get("invocations") or []
    if len(invocations) > 1:  # a resumed run: keep each invocation's command and start
        # since #26 each invocation's own command is `invoked` (`command` stays the first one)
        out["invocations"] = [{"command": i.get("invoked") or i.get("command"),
                               "started": i.get("invoked_at") or i.get("started")} for i in invocations]
    return out


def _dest(root: Path, family: str, name: str, force: bool) -> Path:
    dest = root / family / name
    if dest.exists():
        if not force:
            raise SystemExit(f"save_run: {dest} exists (--force replaces it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return dest


def _today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def _readme(title: str, fields: list[tuple[str, str]], command: str, body: list[str]) -> str:
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {v}" for k, v in fields if v]
    if command:
        lines += ["", "Command:", "", *[f"    {c}" for c in command.splitlines()]]
    while body and not body[0]:
        body = body[1:]
    if body:
        lines += ["", *body]
    return "\n".join(lines).rstrip() + "\n"


def _counts(rows: list[dict], *keys: str) -> str:
    c = Counter(tuple(str(r.get(k)) for k in keys) for r in rows)
    return ", ".join(f"{'/'.join(k)} {n}" for k, n in sorted(c.items()))


def rounded(obj, digits: int = 5):
    """Every float in a JSON value to `digits` significant digits (timings and errors are not
    known better than that); other values as they are."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


TOP_KERNELS = 6  # CUPTI split entries kept per record by --drop-samples; the rest summed into one


def top_kernels(rec: dict, keep: int = TOP_KERNELS) -> int:
    """Keep a record's `keep` longest kernels in perf.kernels_us and sum the others into one
    "(N other kernels)" entry (torch eager launches dozens); returns how many were folded."""
    split = (rec.get("perf") or {}).get("kernels_us")
    if not isinstance(split, dict) or len(split) <= keep + 1:  # idempotent: kept + one folded entry
        return 0
    ranked = sorted(split.items(), key=lambda kv: -kv[1])
    rest = ranked[keep:]
    rec["perf"]["kernels_us"] = {**dict(ranked[:keep]), f"({len(rest)} other kernels)": sum(v for _, v in rest)}
    return len(rest)


def write_rows(dest: Path, rows: list[dict]) -> None:
    """results.jsonl.gz: one JSON object per line, gzipped reproducibly (no timestamp in the header)."""
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (dest / "results.jsonl.gz").write_bytes(gzip.compress(text, compresslevel=9, mtime=0))


def save_sweep(run: Path, family: str, commit: str, device: str, root: Path = ROOT, date: str = "",
               tag: str = "", backs: str = "", notes: tuple[str, ...] = (), force: bool = False,
               command: str = "", drop_samples: bool = False) -> Path:
    from dsv4bench.core.results import RunDir, read_csv

    src = RunDir(run)
    if not src.results.exists() and not src.csv.exists():
        raise SystemExit(f"save_run: {run} holds neither results.jsonl nor results.csv")
    meta = src.read_meta()
    env = meta.get("environment") or {}
    date = date or str(meta.get("started", ""))[:10] or _today()
    dest = _dest(root, family, run_dir_name(date, device, commit, tag), force)
    if src.results.exists() and not drop_samples:  # as written by the sweep, byte for byte (gzipped)
        (dest / "results.jsonl.gz").write_bytes(gzip.compress(src.results.read_bytes(), compresslevel=9, mtime=0))
        rows = [json.loads(line) for line in src.results.read_text().splitlines() if line.strip()]
    else:
        if src.results.exists():
            rows = [json.loads(line) for line in src.results.read_text().splitlines() if line.strip()]
        else:
            rows = [r.to_json() for r in read_csv(src.csv)]
            notes = (*notes, "results.jsonl converted from the run's results.csv (`dsv4bench.core.results.read_csv`).")
        if drop_samples:
            dropped = sum(len((r.get("timing") or {}).pop("samples_ms", None) or []) for r in rows)
            folded = sum(top_kernels(r) for r in rows)
            rows = [rounded(r) for r in rows]
            notes = (*notes, f"timing.samples_ms (the {dropped} per-iteration times) left out, floats rounded to 5 "
                             f"significant digits and the CUPTI split cut to each record's {TOP_KERNELS} longest "
                             f"kernels ({folded} shorter ones summed into one entry) to keep the tree small; every "
                             "record keeps its median, p10, p90, mean, cv and n, which is all `dsv4bench report` and "
                             "`--against` read.")
        write_rows(dest, rows)
    small = compact_meta(meta)
    if small:
        (dest / "run.json").write_text(json.dumps(small, indent=1) + "\n")
    gpu = env.get("gpu") or {}
    recorded = env.get("commit") or "not recorded"
    fields = [("family", family), ("commit", commit7(commit) + ("" if str(recorded).startswith(commit7(commit))
                                                                 else f" (tree recorded in run.json: {recorded})")),
              ("device", " ".join(x for x in (gpu.get("name", device), gpu.get("driver_version") and
                                              f"driver {gpu['driver_version']}") if x)),
              ("started", str(meta.get("started", date))),
              ("records", f"{len(rows)} ({_counts(rows, 'impl', 'status')})"),
              ("backs", backs)]
    body = [f"- {n}" for n in notes] + ["", f"Re-render: `dsv4bench report benchmarks/results/{family}/{dest.name}` "
                                              "(writes index.html and results.csv there; both are git-ignored)."]
    command = meta.get("command") or command
    (dest / "README.md").write_text(_readme(f"{family}: sweep run {dest.name}", fields, command, body))
    return dest


def json_rows(doc) -> tuple[list[dict], dict]:
    """The measured rows of a one-process JSON (fmha_bench, probes): every list of objects at the
    top level (a `group` field names the list when there are several); the rest is metadata."""
    if isinstance(doc, list):
        return [r if isinstance(r, dict) else {"value": r} for r in doc], {}
    lists = {k: v for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}
    meta = {k: v for k, v in doc.items() if k not in lists}
    if len(lists) == 1:
        return list(next(iter(lists.values()))), meta
    return [{"group": k, **r} for k, v in lists.items() for r in v], meta


def save_json(path: Path, family: str, commit: str, device: str, root: Path = ROOT, date: str = "", tag: str = "",
              command: str = "", backs: str = "", notes: tuple[str, ...] = (), force: bool = False,
              rows: list[dict] | None = None, meta: dict | None = None) -> Path:
    if rows is None:
        rows, meta = json_rows(json.loads(Path(path).read_text()))
    meta = meta or {}
    if not rows:
        raise SystemExit(f"save_run: {path} holds no list of measured rows")
    dest = _dest(root, family, run_dir_name(date or _today(), device, commit, tag), force)
    write_rows(dest, rows)
    keys = sorted({k for r in rows for k in r})
    fields = [("family", family), ("commit", commit7(commit)), ("device", device), ("date", date or _today()),
              ("rows", f"{len(rows)}; fields: {', '.join(keys)}"), ("backs", backs)]
    body = [f"- {n}" for n in notes]
    if meta:
        body += ["", "Metadata of the run (the JSON's fields other than its rows):", "", "```json",
                 json.dumps(meta, indent=1), "```"]
    (dest / "README.md").write_text(_readme(f"{family}: {dest.name}", fields, command, body))
    return dest


def junit_rows(xml: Path) -> list[dict]:
    rows = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "")[:300]
                break
        test = "::".join(x for x in (case.get("classname"), case.get("name")) if x)
        rows.append({"test": test, "file": case.get("file", ""),
                     "outcome": outcome, "seconds": float(case.get("time") or 0), "message": message})
    return rows


def _is_conformance(row: dict) -> bool:
    return "conformance" in (row.get("file") or "") + row["test"]


def test_family(row: dict) -> str:
    """tests/<family>/... (a file path, or a dotted classname tests.<family>.test_x) names the family; else 'core'.
    A generic conformance case belongs to the family its id starts with (test_x[gemm-cutedsl-...])."""
    if _is_conformance(row):
        m = re.search(r"\[([A-Za-z0-9_]+)-", row["test"])
        return m.group(1) if m and (KERNELS / m.group(1)).is_dir() else "core"
    for text in (row.get("file") or "", row["test"]):
        m = re.search(r"(?:^|[/.:])tests[/.]([A-Za-z0-9_]+)[/.]", text)
        if m and not m.group(1).startswith("test_") and m.group(1) not in ("py", "conftest"):
            return m.group(1)
    return "core"


def save_junit(xml: Path, commit: str, device: str, root: Path = ROOT, date: str = "", command: str = "",
               notes: tuple[str, ...] = (), force: bool = False) -> list[Path]:
    by: dict[str, list[dict]] = {}
    for r in junit_rows(xml):
        by.setdefault(test_family(r), []).append(r)
    out = []
    for family, rows in sorted(by.items()):
        c = Counter(r["outcome"] for r in rows)
        summary = ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
        tag = "conformance" if all(map(_is_conformance, rows)) else "gpu-tests"
        out.append(save_json(xml, family, commit, device, root, date, tag, command,
                             f"GPU tests of {family}: {summary}", notes, force, rows=rows, meta={}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a sweep run directory, or a JSON (--json) / junit XML (--junit) file")
    ap.add_argument("--family", help="kernel family (the package name under kernels/: rmsnorm, fmha, gemm, ...)")
    ap.add_argument("--commit", required=True, help="the commit whose code ran")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--date", default="", help="YYYY-MM-DD (default: run.json's start, else today)")
    ap.add_argument("--tag", default="", help="suffix when two runs share date, device and commit (probe, variants)")
    ap.add_argument("--root", default=str(ROOT), help="the dataset root (default benchmarks/results)")
    ap.add_argument("--command", default="", help="how a --json / --junit run was made")
    ap.add_argument("--backs", default="", help="the figure this run backs")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--force", action="store_true", help="replace an existing run directory")
    ap.add_argument("--drop-samples", action="store_true",
                    help="leave out timing.samples_ms (the raw per-iteration times; the report reads only their summary) "
                         "and round floats to 5 significant digits")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="SRC is a one-process bench or probe JSON")
    kind.add_argument("--junit", action="store_true", help="SRC is pytest's --junitxml output")
    a = ap.parse_args(argv)
    root, notes = Path(a.root), tuple(a.note)
    if a.junit:
        dests = save_junit(Path(a.src), a.commit, a.device, root, a.date, a.command, notes, a.force)
    else:
        if not a.family:
            ap.error("--family is required")
        if a.json:
            dests = [save_json(Path(a.src), a.family, a.commit, a.device, root, a.date, a.tag, a.command, a.backs,
                               notes, a.force)]
        else:
            dests = [save_sweep(Path(a.src), a.family, a.commit, a.device, root, a.date, a.tag, a.backs, notes,
                                a.force, a.command, a.drop_samples)]
    for d in dests:
        print(d)


if __name__ == "__main__":
    sys.exit(main())
