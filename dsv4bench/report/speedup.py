"""How fast ours is against each peer: the numbers the report and the terminal lead with.

speedup = peer median / our median for the same case, so > 1 means ours is faster. Per peer:
the geometric mean of the speedups, wins (> 1) and losses (< 1), the worst and the best case,
and the same per shape class. A record whose timing spread exceeds NOISY_CV is NOISY: every ratio
it takes part in is shown, marked, and left out of the means (and counted). The spread is the CV of
the middle 80% of the iterations, (p90 - p10) / (2.563 x median) (2.563 standard deviations
separate p10 from p90 of a normal distribution): one stray iteration (a host hiccup of 0.3 ms
among 13 us launches) inflates the plain CV past 100% but does not move the median this trusts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4bench.core.results import GOOD_STATUSES, ResultRecord
from dsv4bench.report.axes import declared
from dsv4bench.report.derived import OURS, shape

NOISY_CV = 0.2  # timing spread above which a median is not trusted for a speed claim
P10_P90_SIGMAS = 2.563
ROWS_PARAMS = ("m", "t", "s_q", "rows", "tokens")  # the token-count param, first one present
DECODE_MAX_ROWS = 256  # rows at or below this are decode (a decode batch: 1-256 tokens), above prefill
CLASS_PARAMS = ("model", "layer")  # named params that are a class of their own when present


def spread(timing: dict | None) -> float | None:
    """The robust CV of a timing: (p90 - p10) / (2.563 x median); the plain CV where p10/p90 are absent."""
    t = timing or {}
    p10, p90, med = t.get("p10_ms"), t.get("p90_ms"), t.get("median_ms")
    if all(isinstance(v, (int, float)) for v in (p10, p90, med)) and med > 0:
        return (p90 - p10) / (P10_P90_SIGMAS * med)
    cv = t.get("cv")
    return cv if isinstance(cv, (int, float)) else None


def is_noisy(rec: ResultRecord) -> bool:
    s = spread(rec.timing)
    return s is not None and s > NOISY_CV


def rows_params(family: str) -> tuple[str, ...]:
    """The token-count param: a family may declare `REPORT_ROWS = "t"` (None: no prefill/decode
    split) in sweeps/<family>.py; else the first of ROWS_PARAMS that a case has."""
    rows = declared(family, "REPORT_ROWS", ROWS_PARAMS)
    return (rows,) if isinstance(rows, str) else tuple(rows or ())


def shape_classes(family: str, params: dict) -> tuple[str, ...]:
    """The classes a case belongs to, one per dimension: 'decode' / 'prefill' by its token count,
    then 'model=...' / 'layer=...' when it has those params."""
    rows = next((params[p] for p in rows_params(family) if isinstance(params.get(p), int)), None)
    phase = () if rows is None else ("decode" if rows <= DECODE_MAX_ROWS else "prefill",)
    return phase + tuple(f"{p}={params[p]}" for p in CLASS_PARAMS if p in params)


@dataclass(frozen=True)
class Ratio:
    """One case: our median against one peer's."""

    case_id: str
    shape: str
    classes: tuple[str, ...]
    peer: str
    ours_ms: float
    peer_ms: float
    noisy: bool  # either side's CV above NOISY_CV

    @property
    def speedup(self) -> float:
        return self.peer_ms / self.ours_ms


@dataclass
class Stats:
    """The ratios of one peer (optionally within one shape class); means over the quiet ones."""

    peer: str
    cls: str
    ratios: list[Ratio]
    quiet: list[Ratio] = field(init=False)

    def __post_init__(self):
        self.quiet = [r for r in self.ratios if not r.noisy]

    @property
    def noisy(self) -> int:
        return len(self.ratios) - len(self.quiet)

    @property
    def geomean(self) -> float | None:
        if not self.quiet:
            return None
        return math.exp(sum(math.log(r.speedup) for r in self.quiet) / len(self.quiet))

    @property
    def wins(self) -> int:
        return sum(r.speedup > 1 for r in self.quiet)

    @property
    def losses(self) -> int:
        return sum(r.speedup < 1 for r in self.quiet)

    @property
    def worst(self) -> Ratio | None:
        return min(self.quiet, key=lambda r: r.speedup, default=None)

    @property
    def best(self) -> Ratio | None:
        return max(self.quiet, key=lambda r: r.speedup, default=None)


@dataclass
class Speed:
    ratios: list[Ratio]
    noisy_records: int  # timed records with CV above NOISY_CV
    per_peer: list[Stats]
    per_class: list[Stats]  # by peer, then class, for the class dimensions that split the cases

    @property
    def peers(self) -> list[str]:
        return [s.peer for s in self.per_peer]


def timed(records: list[ResultRecord]) -> list[ResultRecord]:
    """The last record per task that passed and has a median (a fast wrong answer is no speed)."""
    latest = {r.task: r for r in records}
    return [r for r in latest.values() if r.status in GOOD_STATUSES and (r.timing or {}).get("median_ms")]


def shipped(records: list[ResultRecord]) -> dict[str, ResultRecord]:
    """case id -> our shipped impl's record (impl `cutedsl`; the declared variants `cutedsl:<name>`
    share its backend but are not what a user gets, and are no peer either)."""
    return {r.case_id: r for r in records if r.impl == OURS}


def ratios(records: list[ResultRecord]) -> list[Ratio]:
    """Every (case, peer) timed on both sides, in record order."""
    good = timed(records)
    ours = shipped(good)
    out = []
    for r in good:
        mine = ours.get(r.case_id)
        if r.backend == OURS or mine is None:
            continue
        out.append(Ratio(r.case_id, shape(r.params), shape_classes(r.family, r.params), r.impl,
                         mine.timing["median_ms"], r.timing["median_ms"], is_noisy(mine) or is_noisy(r)))
    return out


def _group(rs: list[Ratio], key) -> dict:
    groups: dict = {}
    for r in rs:
        groups.setdefault(key(r), []).append(r)
    return groups


def speed(records: list[ResultRecord]) -> Speed | None:
    """None when no case was timed for ours and a peer."""
    rs = ratios(records)
    if not rs:
        return None
    per_peer = [Stats(p, "all", g) for p, g in sorted(_group(rs, lambda r: r.peer).items())]
    # a dimension (phase, model, layer) splits the cases when it holds more than one class
    dims: dict[str, set] = {}
    for r in rs:
        for c in r.classes:
            dims.setdefault(c.partition("=")[0] if "=" in c else "phase", set()).add(c)
    split = [c for cs in dims.values() if len(cs) > 1 for c in sorted(cs)]
    per_class = [Stats(s.peer, c, [r for r in s.ratios if c in r.classes]) for s in per_peer for c in split]
    return Speed(rs, sum(is_noisy(r) for r in timed(records)), per_peer, per_class)


def csv_columns(records: list[ResultRecord]) -> dict[str, dict[str, float]]:
    """task of our record -> {`<peer>_ms`, `speedup_vs_<peer>`} for results.csv (no dots: the
    CSV reader takes a dotted column for a nested field)."""
    out: dict[str, dict[str, float]] = {}
    ours = {case: r.task for case, r in shipped(timed(records)).items()}
    for r in ratios(records):
        peer = r.peer.replace(".", "_")
        out.setdefault(ours[r.case_id], {}).update({f"{peer}_ms": r.peer_ms, f"speedup_vs_{peer}": r.speedup})
    return out


def describe(s: Stats) -> str:
    """One line, the same in the terminal and the HTML: geomean, wins/losses, worst and best."""
    if s.geomean is None:
        return f"vs {s.peer}: no quiet case ({s.noisy} NOISY left out)"
    line = (f"vs {s.peer}: speedup ({s.peer} ms / ours ms) geomean {s.geomean:.2f}x, {verdict(s.geomean)}"
            f" · {s.wins} wins, {s.losses} losses of {len(s.quiet)}"
            f" · worst {s.worst.speedup:.2f}x ({s.worst.case_id}) · best {s.best.speedup:.2f}x ({s.best.case_id})")
    return line + (f" · {s.noisy} NOISY left out" if s.noisy else "")


def verdict(speedup: float) -> str:
    return "ours faster" if speedup > 1 else "ours slower" if speedup < 1 else "even"
