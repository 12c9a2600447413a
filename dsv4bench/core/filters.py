"""Command-line shape filters (--hd 64,128 --width 7168 ...): parsing and applying them to cases."""

from __future__ import annotations

from dataclasses import replace

from dsv4bench.core.case import Case


def parse_int_list(option: str, raw: str) -> list[int]:
    items = [s.strip() for s in str(raw).split(",") if s.strip()]
    if not items:
        raise ValueError(f"--{option} needs a comma-separated list of integers, got '{raw}'")
    try:
        values = [int(s) for s in items]
    except ValueError:
        raise ValueError(f"--{option} needs a comma-separated list of integers, got '{raw}'") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"--{option} values must be positive, got '{raw}'")
    return values


def parse_choice_list(option: str, raw: str, choices: list[str]) -> list[str]:
    values = [s.strip() for s in str(raw).split(",") if s.strip()]
    bad = [v for v in values if v not in choices]
    if not values or bad:
        raise ValueError(f"--{option} takes {', '.join(choices)}; got '{raw}'")
    return values


def apply_filters(cases: list[Case], filters: dict, option_to_param: dict[str, str],
                  defaults: dict | None = None) -> list[Case]:
    """Keep the cases whose params match every filter; a case without a parameter has its default
    (`defaults`, by parameter; None). Filters select from the family's case space (grid + draws); a
    value no case has selects nothing, and `sweep` says so."""
    defaults = defaults or {}
    out = []
    for c in cases:
        if all(c.get(param, defaults.get(param)) in filters[opt] for opt, param in option_to_param.items()
               if opt in filters):
            out.append(c)
    return out


def grid_at_asked_values(grid: list[Case], filters: dict, options: dict) -> list[Case]:
    """For each option that `extends` (Option.extends), the grid's cases with each asked value the grid
    lacks put in, origin "cli" (`--rows 96`: every grid shape at M 96; two such options: their
    combinations). The filters then select among grid, these and the draws as usual."""
    base = list(grid)
    for opt, values in filters.items():
        o = options[opt]
        if not o.extends:
            continue
        have = {c.get(o.param, o.default) for c in base}
        base += [Case(c.family, {**c.params, o.param: v}, c.seed, "cli") for v in values if v not in have for c in base]
    grid_ids = {c.id for c in grid}
    return list({c.id: c for c in base if c.id not in grid_ids}.values())


DRAW_GROWTH, MAX_DRAWS_PER_EXAMPLE, MIN_DRAW_BUDGET = 4, 50, 1000


def cases_under_filters(family, opts) -> tuple[list[Case], int]:
    """The family's cases with `opts.examples` hypothesis draws that satisfy `opts.filters` (not
    N draws, then filtered): draw more, 4x at a time, until N satisfy them or the draw budget
    (50 per example asked, at least 1000) is spent. Deterministic for a seed. Returns the cases
    (grid first, then the first N satisfying draws) and how many draws were made; fewer than N
    drawn cases means no more exist within the budget."""
    want, n = opts.examples, opts.examples
    budget = max(want * MAX_DRAWS_PER_EXAMPLE, MIN_DRAW_BUDGET)
    while True:
        cases = family.cases(replace(opts, examples=n))
        drawn = [c for c in cases if c.origin == "hypothesis"]
        if len(drawn) >= want or not opts.filters or n >= budget:
            break
        n = min(n * DRAW_GROWTH, budget)
    return [c for c in cases if c.origin != "hypothesis"] + drawn[:want], n
