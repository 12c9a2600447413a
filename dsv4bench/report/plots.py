"""The report's figures, drawn with matplotlib (Agg) and returned as base64 PNG data URIs, so the
HTML page embeds them and opens offline."""

from __future__ import annotations

import base64
import io
import math
import textwrap
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dsv4bench.core.results import GOOD_STATUSES, ResultRecord  # noqa: E402
from dsv4bench.report.derived import OURS, error_ratio, rel_l2, roofline, worst  # noqa: E402

GRID_MAX = 20  # distinct values per axis up to which the heatmap is a categorical grid
ANNOTATE_MAX = 150  # cells up to which each cell prints its value
BARS_MAX = 40  # cases in the %-of-limit bar chart
RATIO_NORM = Normalize(0.0, 2.0)  # max|err|/bound: <= 1 passes; the colour saturates at 2x the bound
MARKERS = "osD^vP*X<>"
DPI = 80  # the PNGs' resolution; a figure whose layout measures text is made at it (hinting is not linear)
# one colour per impl in every figure and in the page's legend (matplotlib's tab10, ours first)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
LABEL_WRAP = 60  # characters per line of a bar chart's case label


def impl_colours(records: list[ResultRecord]) -> dict[str, str]:
    """impl -> colour, the same for the whole report: our impls first, then the peers by name."""
    impls = sorted({(r.backend != OURS, r.impl) for r in records})
    return {impl: PALETTE[i % len(PALETTE)] for i, (_, impl) in enumerate(impls)}


def data_uri(fig: Figure) -> str:
    """Fixed margins (set per figure), not bbox_inches="tight", which draws every figure twice."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def error_heatmap(records: list[ResultRecord], x: str, y: str | None, title: str) -> str | None:
    """Colour = worst max|err|/bound (left) and relative L2 error (right) over params x by y, the
    worst case per cell over the other params; x marks a failing cell."""
    cells: dict[tuple, list] = defaultdict(lambda: [0.0, 0.0, False])
    for r in records:
        ratio = error_ratio(r)
        if ratio is None or x not in r.params or (y and y not in r.params):
            continue
        cell = cells[(r.params[x], r.params[y] if y else "")]
        cell[0] = worst((cell[0], ratio))
        cell[1] = worst((cell[1], rel_l2(r) or 0.0))
        cell[2] = cell[2] or r.status not in GOOD_STATUSES
    if not cells:
        return None
    xs = sorted({k[0] for k in cells}, key=_sort_key)
    ys = sorted({k[1] for k in cells}, key=_sort_key)
    grid = len(xs) <= GRID_MAX and len(ys) <= GRID_MAX
    fig = Figure(figsize=(12, max(3.2, 0.32 * len(ys) + 1.8) if grid else 4.6))
    axes = fig.subplots(1, 2)
    rels = [c[1] for c in cells.values() if 0 < c[1] < math.inf]
    # a decade below the smallest non-zero error, where exact zeros sit
    rel_norm = LogNorm(min(rels) / 10, max(rels)) if rels else Normalize(0, 1)
    for ax, idx, norm, cmap, label in ((axes[0], 0, RATIO_NORM, "RdYlGn_r", "max|err| / bound (pass <= 1)"),
                                       (axes[1], 1, rel_norm, "viridis", "relative L2 error")):
        if grid:
            _grid(fig, ax, cells, xs, ys, idx, norm, cmap, label)
        else:
            _scatter(fig, ax, cells, idx, norm, cmap, label, numeric_y=bool(y))
        ax.set_xlabel(x)
        ax.set_ylabel(y or "")
    fig.suptitle(title)
    fig.subplots_adjust(left=0.07, right=0.97, bottom=0.22 if grid else 0.13, top=0.88, wspace=0.25)
    return data_uri(fig)


def _colour_value(v: float, norm) -> float:
    """What a cell is coloured by: an exact zero error takes the lowest colour (a log scale would
    show it as "no case"), an inf or NaN error the highest (matplotlib masks both as "no case")."""
    if not math.isfinite(v):
        return norm.vmax
    return max(v, norm.vmin) if v <= 0 else v


def _grid(fig, ax, cells, xs, ys, idx, norm, cmap, label) -> None:
    shown = [[_colour_value(cells[(xv, yv)][idx], norm) if (xv, yv) in cells else math.nan for xv in xs]
             for yv in ys]
    cmap = matplotlib.colormaps[cmap].with_extremes(bad="#eeeeee")
    im = ax.imshow(shown, cmap=cmap, norm=norm, aspect="auto", origin="lower")
    fig.colorbar(im, ax=ax, label=label)
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=60, fontsize=7)
    ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=7)
    annotate = len(xs) * len(ys) <= ANNOTATE_MAX
    for (xv, yv), cell in cells.items():
        i, j = ys.index(yv), xs.index(xv)
        if cell[2]:
            ax.text(j, i, "\u00d7", ha="center", va="center", fontsize=12, fontweight="bold")
        elif annotate:
            ax.text(j, i, f"{cell[idx]:.1g}", ha="center", va="center", fontsize=6,
                    color="white" if idx == 1 else "black")


def _scatter(fig, ax, cells, idx, norm, cmap, label, numeric_y: bool) -> None:
    pts = [(k[0], k[1] if numeric_y else 0, c[idx], c[2]) for k, c in cells.items()
           if isinstance(k[0], (int, float)) and (not numeric_y or isinstance(k[1], (int, float)))]
    ok = [p for p in pts if not p[3]]
    bad = [p for p in pts if p[3]]
    sc = ax.scatter([p[0] for p in ok], [p[1] for p in ok], c=[_colour_value(p[2], norm) for p in ok], cmap=cmap,
                    norm=norm, s=18)
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", c="black", s=50, label="fails")
        ax.legend(loc="best", fontsize=7)
    fig.colorbar(sc, ax=ax, label=label)
    if all(p[0] > 0 for p in pts):
        ax.set_xscale("log")
    if numeric_y and all(p[1] > 0 for p in pts):
        ax.set_yscale("log")


def roofline_plot(records: list[ResultRecord], title: str, colours: dict[str, str]) -> str | None:
    """Each timed record as a point (arithmetic intensity, TFLOP/s) under the measured ceilings. Ops of
    no flops (a top-k moves bytes only) have no place on log axes: their share of the copy bandwidth is
    in the limit bars."""
    by_impl: dict[str, list] = defaultdict(list)
    for r in records:
        roof = roofline(r)
        if roof and roof.intensity > 0 and roof.tflops > 0:
            by_impl[r.impl].append(roof)
    if not by_impl:
        return None
    roofs = [p for pts in by_impl.values() for p in pts]
    gemm = max(p.gemm_tflops for p in roofs)
    copy = max(p.copy_gbps for p in roofs)
    lo = min(p.intensity for p in roofs) / 4
    hi = max(max(p.intensity for p in roofs) * 4, 2e3 * gemm / copy)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    ax.plot(xs, [min(gemm, copy * x / 1e3) for x in xs], color="black", lw=1.5,
            label=f"measured limit: copy {copy:.0f} GB/s, bf16 GEMM {gemm:.0f} TFLOP/s")
    for i, (impl, pts) in enumerate(sorted(by_impl.items())):
        ax.scatter([p.intensity for p in pts], [p.tflops for p in pts], marker=MARKERS[i % len(MARKERS)], s=24,
                   label=impl, alpha=0.8, color=colours[impl])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.11, top=0.92)
    return data_uri(fig)


def limit_bars(perf_rows: list[dict], title: str, colours: dict[str, str]) -> str | None:
    fig = limit_bars_figure(perf_rows, title, colours)
    return data_uri(fig) if fig else None


def _varying(perf_rows: list[dict]) -> set[str]:
    """The params that differ between the cases (the label shows those alone)."""
    values: dict[str, set] = defaultdict(set)
    for row in perf_rows:
        for part in row["shape"].split(" "):
            k, _, v = part.partition("=")
            values[k].add(v)
    return {k for k, vs in values.items() if len(vs) > 1} or set(values)


def limit_bars_figure(perf_rows: list[dict], title: str, colours: dict[str, str]) -> Figure | None:
    """% of the measured limit per shape, one bar per impl (the first BARS_MAX timed cases). Labels
    are the case id and the params that vary, wrapped, with the left margin measured to fit them."""
    cases: list[str] = []
    impls: list[str] = []
    pct: dict[tuple, float] = {}
    for row in perf_rows:
        if row["roof"] is None:
            continue
        if row["case_id"] not in cases:
            if len(cases) == BARS_MAX:
                continue
            cases.append(row["case_id"])
        if row["impl"] not in impls:
            impls.append(row["impl"])
        pct[(row["case_id"], row["impl"])] = row["roof"].pct_limit
    if not pct:
        return None
    varying = _varying(perf_rows)
    labels = {row["case_id"]: "\n".join(textwrap.wrap(
        row["case_id"] + "  " + " ".join(p for p in row["shape"].split(" ") if p.partition("=")[0] in varying),
        LABEL_WRAP)) for row in perf_rows}
    lines = max(labels[c].count("\n") + 1 for c in cases)
    height = 0.8 / len(impls)
    fig = Figure(figsize=(11, 1.2 + 0.22 * len(cases) * max(1, len(impls) / 2, 0.6 * lines)), dpi=DPI)
    ax = fig.subplots()
    for j, impl in enumerate(impls):
        ys = [i + j * height for i, c in enumerate(cases) if (c, impl) in pct]
        ax.barh(ys, [pct[(c, impl)] for c in cases if (c, impl) in pct], height=height, label=impl,
                color=colours[impl])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(cases))], [labels[c] for c in cases], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(100, color="black", lw=1)
    ax.set_xlabel("% of the measured limit (roofline at the case's intensity)")
    ax.set_title(title)
    inches = fig.get_size_inches()
    renderer = FigureCanvasAgg(fig).get_renderer()
    label_px = max(t.get_window_extent(renderer).width for t in ax.get_yticklabels())
    left = (label_px / fig.dpi + 0.25) / inches[0]
    fig.subplots_adjust(left=min(left, 0.7), right=0.89, bottom=0.7 / inches[1], top=1 - 0.4 / inches[1])
    return fig
