"""One run against another: per task a timing verdict, plus the new failures and the fixes.

Tasks pair by their key (case id, impl, arch, mode); a case id is a hash of params and seed, so
two sweeps with the same seed pair up case by case. `base` is the other run (--against), `new`
the one being reported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dsv4bench.core.results import GOOD_STATUSES, ResultRecord
from dsv4bench.report.derived import shape
from dsv4bench.report.verdict import SLOWER, Spread, verdict

FAIL_ON = ("slower", "new-failures")  # what `report --against --fail-on` turns into exit status 1


class NothingInCommon(ValueError):
    """The two runs share no task: nothing to compare (one line for the user, exit 2)."""


@dataclass
class Comparison:
    base_path: str
    rows: list[dict] = field(default_factory=list)  # timed in both runs
    new_failures: list[dict] = field(default_factory=list)
    fixes: list[dict] = field(default_factory=list)
    only_new: int = 0
    only_base: int = 0

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r["verdict"] for r in self.rows))

    @property
    def slower(self) -> list[dict]:
        """Tasks SLOWER beyond the noise rule (p10..p90 apart and the medians more than 3% apart)."""
        return [r for r in self.rows if r["verdict"] == SLOWER]

    def failed(self, fail_on: tuple[str, ...]) -> list[str]:
        """Why `--fail-on` makes the comparison fail: one line per reason, none when it passes."""
        reasons = []
        if "slower" in fail_on and self.slower:
            reasons.append(f"{len(self.slower)} task(s) SLOWER than {self.base_path}")
        if "new-failures" in fail_on and self.new_failures:
            reasons.append(f"{len(self.new_failures)} new failure(s) against {self.base_path}")
        return reasons


def _latest(records: list[ResultRecord]) -> dict[str, ResultRecord]:
    """task -> its last record (a resumed run may hold a task twice)."""
    return {r.task: r for r in records}


def _change_row(b: ResultRecord | None, n: ResultRecord) -> dict:
    """A status change; `reason` is the failing side's."""
    reason = n.reason if n.status not in GOOD_STATUSES or b is None else b.reason
    return {"case_id": n.case_id, "shape": shape(n.params), "impl": n.impl, "arch": n.arch, "mode": n.mode,
            "base_status": b.status if b else "not run", "new_status": n.status, "reason": reason}


def compare_runs(base: list[ResultRecord], new: list[ResultRecord], base_path: str) -> Comparison:
    old, cur = _latest(base), _latest(new)
    if not old.keys() & cur.keys():
        raise NothingInCommon(f"{base_path} has no task in common with this run (different family, seed or "
                              "impls?): nothing to compare")
    cmp = Comparison(base_path, only_new=len(cur.keys() - old.keys()), only_base=len(old.keys() - cur.keys()))
    for task, n in cur.items():
        b = old.get(task)
        if b is None:
            if n.status not in GOOD_STATUSES:
                cmp.new_failures.append(_change_row(None, n))
            continue
        bad_before, bad_now = b.status not in GOOD_STATUSES, n.status not in GOOD_STATUSES
        if bad_now and not bad_before:
            cmp.new_failures.append(_change_row(b, n))
        elif bad_before and not bad_now:
            cmp.fixes.append(_change_row(b, n))
        if b.timing and n.timing and b.timing.get("median_ms") and n.timing.get("median_ms"):
            v = verdict(Spread.of(b.timing), Spread.of(n.timing))
            cmp.rows.append({"case_id": n.case_id, "shape": shape(n.params), "impl": n.impl, "arch": n.arch,
                             "base_ms": b.timing["median_ms"], "new_ms": n.timing["median_ms"], "change": v.change,
                             "base_noise": v.base_noise, "new_noise": v.new_noise, "verdict": v.verdict})
    return cmp
