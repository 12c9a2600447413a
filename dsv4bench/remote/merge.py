"""Merge the run directories of a sharded sweep (`sweep --shard i/n`, one per Slurm array task) into
one run directory: every shard's records in one results.jsonl, one run.json, one results.csv."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bench.core.results import RunDir


def find_run_dirs(root: Path) -> list[Path]:
    """Directories under `root` that hold a results.jsonl, in path order."""
    return sorted(p.parent for p in root.rglob("results.jsonl"))


def merge_run_dirs(sources: list[Path], dest: Path) -> RunDir:
    out = RunDir(dest).create()
    records: dict[str, dict] = {}
    metas = [RunDir(s).read_meta() for s in sources]
    for src in sources:
        for rec in RunDir(src).records():  # complete lines only; a later duplicate of a task wins
            records.pop(rec.task, None)
            records[rec.task] = {**rec.to_json(), "run_id": out.run_id}
    out.results.write_text("".join(json.dumps(r, default=str) + "\n" for r in records.values()))
    meta = dict(metas[0]) if metas else {}
    meta["cases"] = {k: v for m in metas for k, v in m.get("cases", {}).items()}
    meta["invocations"] = [inv for m in metas for inv in m.get("invocations", [])]
    meta["shards"] = [{"source": str(s), "records": len(RunDir(s).records())} for s in sources]
    tmp = out.meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str))
    tmp.replace(out.meta)
    out.write_csv()
    return out
