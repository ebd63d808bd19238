"""A paper figure (``tinymcf plot --panels ...`` or ``--metrics ...``): the chosen panels only, sized for print.

The estimate and the control are told apart by colour and hatching in grey print too; several runs are small
multiples, or overlaid. What it draws: docs/cli.md, "A paper figure".
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from ..data.sets import CONTROL
from ..scoring.prompts import answer_format_of
from ..views.curves import HEADLINE, SANITY, History, PlotOptionError, foundation_order, metric_key
from .benchmark import draw_benchmark
from .drawing import (
    Labelled,
    Style,
    at_least,
    dose_handles,
    draw_lone,
    draw_not_answering,
    draw_random,
    interval_name,
    legend,
    require_matplotlib,
    run_styles,
    x_label,
    x_locator,
    zero_line,
)

logger = logging.getLogger("tinymcf_callback")

PANEL_GROUPS = ("dashboard", "headline", "foundations", "sanity")
PAPER_WIDTH = 3.4  # inches: one column of a two-column journal page
WIDTH_RANGE = (1.5, 20.0)
PAPER_FONT = 8  # points: titles and axis labels; ticks and legend one point smaller
PAPER_DPI = 300  # a PNG paper figure is printed: 3.4 in at 300 dpi is 1020 pixels
LEADS = {"sn": "score", "yn_mass_min": "yn_mass_mean"}  # a key drawn in the panel of its lead when both are chosen
CONTROL_KEYS = frozenset({"sn", f"align_other:{CONTROL}", f"align_self:{CONTROL}"})


@dataclass(frozen=True)
class Role:
    """How one kind of curve looks in a paper figure: colour, interval hatching, line style, marker."""

    colour: str
    hatch: str
    linestyle: str
    marker: str


ESTIMATE = Role("#0072B2", "///", "-", "o")  # Okabe-Ito blue
CONTROL_ROLE = Role("#D55E00", "\\\\\\", "--", "s")  # Okabe-Ito vermilion, the other diagonal
HATCH_ALPHA, HATCH_WIDTH = 0.5, 0.6  # the hatch lines of a band: half-opaque, 0.6 pt


def _role(key: str, position: int) -> Role:
    return CONTROL_ROLE if key in CONTROL_KEYS or position > 0 else ESTIMATE


@dataclass(frozen=True)
class Panel:
    """One panel of a paper figure: its metric keys (the first is the estimate), title, short name, y label, range."""

    keys: tuple[str, ...]
    title: str
    short: str  # the row's name in small multiples (the y label of its first column)
    ylabel: str
    ylim: tuple[float, float] | None = None  # fixed range; None: the data's, widened to MIN_SPAN
    zero: bool = True  # draw the zero line


def split_names(value) -> list[str]:
    """The names of an option: a comma-separated string or a list, blanks dropped (None: none)."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


def chosen_metrics(histories: list[History], panels=None, metrics=None) -> list[str] | None:
    """The metric keys of a paper figure, in order; ``None`` for the dashboard.

    ``panels``: panel groups (a comma-separated string or a list) of :data:`PANEL_GROUPS`; ``metrics``:
    metric names (:func:`~tinymcf_callback.views.curves.metric_key`). Both given: the groups' metrics,
    then the others. Raises :class:`PlotOptionError` for an unknown group or metric.
    """
    groups, names = split_names(panels), split_names(metrics)
    unknown = [g for g in groups if g not in PANEL_GROUPS]
    if unknown:
        raise PlotOptionError(f"unknown panel group {unknown[0]!r}: choose from {', '.join(PANEL_GROUPS)} (several "
                              f"comma-separated, e.g. --panels headline,sanity), or name metrics with --metrics")
    if "dashboard" in groups:
        if len(groups) > 1 or names:
            raise PlotOptionError("--panels dashboard draws every panel; a paper figure is --panels headline, "
                                  "foundations or sanity, or --metrics: give one or the other")
        return None
    if not groups and not names:
        return None
    present = foundation_order(f for h in histories for f in h.foundations)
    keys = []
    for group in groups:
        keys += {"headline": list(HEADLINE), "sanity": list(SANITY),
                 "foundations": [f"align_other:{f}" for f in present]}[group]
    keys += [metric_key(name, present) for name in names]
    return list(dict.fromkeys(keys))


def _why_missing(key: str) -> str:
    if key in ("sn", "score_minus_sn", f"align_other:{CONTROL}", f"align_self:{CONTROL}"):
        return "no Social Norms vignettes probed"
    if key == "human_corr":
        return "the set has no human ratings"
    if ":" in key:
        return f"no {key.partition(':')[2]} vignettes probed"
    return "not in the lines"


def paper_panels(keys: list[str], histories: list[History]) -> list[Panel]:
    """The panels of ``keys``: a key with no value at any point of any run is left out (a warning says which);
    ``sn`` joins ``score``'s panel and ``yn_mass_min`` ``yn_mass_mean``'s when both are chosen."""
    kept = [k for k in keys if any(h.has_value(k) for h in histories)]
    where = "any coefficient" if histories[0].x == "coefficient" else "any step"
    files = ", ".join(str(h.path) for h in histories)
    if not kept:
        raise PlotOptionError(f"nothing to draw: none of {', '.join(keys)} has a value at {where} of {files}; "
                              f"choose other --panels or --metrics")
    dropped = [k for k in keys if k not in kept]
    if dropped:
        logger.warning("left out of the figure, no value at %s in any run: %s", where,
                       "; ".join(f"{k} ({_why_missing(k)})" for k in dropped))
    pairs = {lead: follower for follower, lead in LEADS.items()}
    fmt = answer_format_of(histories[0].answer_format)
    panels, used = [], set()
    for key in kept:
        if key in used:
            continue
        if pairs.get(key) in kept:
            group = (key, pairs[key])
        elif LEADS.get(key) in kept:
            group = (LEADS[key], key)
        else:
            group = (key,)
        used.update(group)
        panels.append(_panel(group, fmt.shown))
    return panels


def _panel(keys: tuple[str, ...], shown: tuple[str, str]) -> Panel:
    pos, neg = shown
    mass = f"{pos}+{neg} mass"
    fixed = {
        ("score", "sn"): ("Score and Social Norms control", "score, control", "alignment"),
        ("score",): ("Score", "score", "alignment"),
        ("sn",): ("Social Norms control", "control", "alignment"),
        ("score_minus_sn",): ("Score minus control", "score − control", "score − control"),
        ("gap",): ("Self-other gap", "self-other gap", "other − self"),
        ("yn_mass_mean", "yn_mass_min"): (f"{mass}: mean, min", mass, f"P({pos}) + P({neg})"),
        ("yn_mass_mean",): (f"{mass} (mean)", f"{mass} (mean)", f"P({pos}) + P({neg})"),
        ("yn_mass_min",): (f"{mass} (min)", f"{mass} (min)", f"P({pos}) + P({neg})"),
        ("frame_agreement",): ("Frame agreement", "frame agreement", "correlation"),
        ("human_corr",): ("Correlation with human ratings", "human r", "Pearson r"),
    }
    if keys in fixed:
        title, short, ylabel = fixed[keys]
        if keys[0].startswith("yn_mass"):
            return Panel(keys, title, short, ylabel, ylim=(0.0, 1.05), zero=False)
        if keys[0] in ("frame_agreement", "human_corr"):
            return Panel(keys, title, short, ylabel, ylim=(-1.05, 1.05))
        return Panel(keys, title, short, ylabel)
    metric, _, foundation = keys[0].partition(":")
    name = f"{foundation} (control)" if foundation == CONTROL else foundation
    if metric == "align_self":
        return Panel(keys, f"{name}: align_self", f"{foundation}: self", "align_self")
    return Panel(keys, name, foundation, "align_other")


def _paper_series(ax, mpl, h: History, key: str, colour: str, role: Role, *, marker: str, hatched: bool,
                  band_alpha: float) -> bool:
    """One curve of a paper panel with its interval band (hatched unless overlaid); True when a band was drawn."""
    series = h.series(key)
    x = h.steps
    ax.plot(x, series.est, color=colour, linestyle=role.linestyle, linewidth=1.1, marker=marker, markersize=2.5,
            markerfacecolor=colour if role is ESTIMATE else "white", markeredgewidth=0.8, zorder=3,
            label=f"{h.label} · {key}")
    if series.lo is None or series.hi is None or not (np.isfinite(series.lo) & np.isfinite(series.hi)).any():
        return False
    to_rgba = mpl.colors.to_rgba
    band = ax.fill_between(x, series.lo, series.hi, facecolor=to_rgba(colour, band_alpha), linewidth=0, zorder=2,
                           edgecolor=to_rgba(colour, HATCH_ALPHA) if hatched else "none",
                           hatch=role.hatch if hatched else None, label=f"{h.label} · {key} interval")
    if hatched and hasattr(band, "set_hatch_linewidth"):  # matplotlib >= 3.10; before, the rcParam's 1 pt
        band.set_hatch_linewidth(HATCH_WIDTH)
    draw_lone(ax, x, series, colour, f"{h.label} · {key}", linewidth=2.5)
    return True


def _draw_paper_panel(ax, mpl, h: History, panel: Panel, *, style: Style | None) -> set[str]:
    """One run's curves of ``panel`` on ``ax`` (``style``: the run's, when runs are overlaid); what was drawn."""
    drawn = set()
    draw_random(ax, h, panel.keys[0], linewidth=0.7)
    if h.random and np.isfinite(h.random_envelope(panel.keys[0]).median).any():
        drawn.add("random")
    for position, key in enumerate(panel.keys):
        role = _role(key, position)
        colour = style.colour if style else role.colour
        marker = style.marker if style else role.marker
        if not h.has_value(key):
            continue
        drawn.add(key)
        if _paper_series(ax, mpl, h, key, colour, role, marker=marker, hatched=style is None,
                         band_alpha=0.07 if style else 0.13):
            drawn.add(f"{key} interval")
        draw_not_answering(ax, h, key, "0.1" if style is None else colour, size=4.5)
        if h.answering is not None and not h.answering.all():
            drawn.add("not answering")
    return drawn


def _style_axes(ax, mpl, histories: list[History], panel: Panel) -> None:
    ax.tick_params(labelsize=PAPER_FONT - 1, length=2.5, pad=1.5)
    ax.grid(True, color="0.93", linewidth=0.5)
    ax.spines[["top", "right"]].set_visible(False)
    if panel.zero:
        zero_line(ax)
    if histories[0].x == "coefficient":
        ax.axvline(0.0, color="0.85", linewidth=0.6, zorder=0, label="_unsteered")
    ax.xaxis.set_major_locator(x_locator(mpl, histories, nbins=4))
    ax.yaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=4))


def _check_width(width) -> float:
    width = PAPER_WIDTH if width is None else width
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not math.isfinite(width) or \
            not WIDTH_RANGE[0] <= width <= WIDTH_RANGE[1]:
        raise PlotOptionError(f"--width {width!r}: the figure's width in inches, from {WIDTH_RANGE[0]:g} to "
                              f"{WIDTH_RANGE[1]:g} (one journal column is about 3.4, a full page about 7)")
    return float(width)


def _grid(n_panels: int, n_runs: int) -> tuple[int, int]:
    """(rows, columns): small multiples are panels × runs; one run fills one column, two from four panels on."""
    if n_runs > 1:
        return n_panels, n_runs
    ncols = 1 if n_panels <= 3 else 2
    return math.ceil(n_panels / ncols), ncols


def draw_paper(histories: list[History], keys: list[str], *, title: str | None = None, width: float | None = None,
               overlay: bool = False):
    """A paper figure of metrics ``keys`` (see the module): one column wide, small fonts, no empty panel."""
    mpl = require_matplotlib()
    width = _check_width(width)
    panels = paper_panels(keys, histories)
    multiples = len(histories) > 1 and not overlay
    nrows, ncols = _grid(len(panels), len(histories) if multiples else 1)
    row_h = min(1.6, max(1.0, 0.55 * width / ncols)) + 0.3  # inches: the panel and its title and tick labels
    fig = mpl.figure.Figure(figsize=(width, nrows * row_h), layout="constrained")
    fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, hspace=0.03, wspace=0.03)
    grid = fig.subplots(nrows, ncols, sharex=True, sharey="row" if multiples else False, squeeze=False)
    styles = run_styles(histories) if overlay else [None] * len(histories)
    drawn: set[str] = set()
    bench_handles: list = []
    placed = []  # (axes, panel) in drawing order
    for i, panel in enumerate(panels):
        cells = [(i, j) for j in range(ncols)] if multiples else [divmod(i, ncols)]
        for run, (r, c) in enumerate(cells):
            ax = grid[r][c]
            runs = [histories[run]] if multiples else histories
            _style_axes(ax, mpl, histories, panel)
            for h, style in zip(runs, [styles[run]] if multiples else styles, strict=True):
                drawn |= _draw_paper_panel(ax, mpl, h, panel, style=style)
            if panel.keys[0] == "score":  # the slow benchmark's accuracies on an axis of their own
                colours = [s.colour if s else ESTIMATE.colour for s in ([styles[run]] if multiples else styles)]
                bench_handles = draw_benchmark(ax, runs, colours, fontsize=PAPER_FONT, markersize=3.5) or bench_handles
            if multiples and not any(h.has_value(k) for h in runs for k in panel.keys):
                ax.text(0.5, 0.5, "no value in this run", transform=ax.transAxes, ha="center", va="center",
                        fontsize=PAPER_FONT - 1, color="0.4")
            who = runs[0].label if multiples else ", ".join(h.label for h in runs)
            ax.set_label(f"{who} · {panel.title}")
            if multiples:
                if r == 0:
                    ax.set_title(runs[0].label, fontsize=PAPER_FONT, fontweight="bold")
                if c == 0:
                    ax.set_ylabel(panel.short, fontsize=PAPER_FONT)
            else:
                ax.set_title(panel.title, fontsize=PAPER_FONT)
                ax.set_ylabel(panel.ylabel, fontsize=PAPER_FONT)
            placed.append((ax, panel))
    for slot in range(len(panels), nrows * ncols if not multiples else 0):  # an odd panel out leaves a slot: no blank
        r, c = divmod(slot, ncols)
        fig.delaxes(grid[r][c])
        grid[r - 1][c].tick_params(labelbottom=True)
    if not multiples and ncols > 1:
        _share_units(placed, ncols)
    for ax, panel in placed:
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        else:
            at_least(ax)
        if _is_bottom(ax, grid, nrows, ncols, len(panels), multiples):
            ax.set_xlabel(x_label(histories), fontsize=PAPER_FONT)
    handles = _paper_handles(mpl, histories, drawn, styles if overlay else None) + bench_handles
    legend_cols = _legend_columns(handles, width)
    if handles:
        legend(fig, handles, loc="outside lower center", ncols=legend_cols, fontsize=PAPER_FONT - 1, frameon=False,
                handlelength=2.2, columnspacing=1.2, handletextpad=0.5, borderaxespad=0.2)
    if title:
        fig.suptitle(title, fontsize=PAPER_FONT + 1)
    legend_h = (0.1 + 0.16 * math.ceil(len(handles) / legend_cols)) if handles else 0.0
    fig.set_size_inches(width, nrows * row_h + legend_h + (0.2 if title else 0.0))
    return fig


def _share_units(placed: list, ncols: int) -> None:
    """One run's grid: panels of one unit (the same y label, e.g. every foundation's align_other) share the y axis,
    so their heights compare; a panel whose left neighbour shares it drops its y label and tick labels."""
    first: dict[str, object] = {}
    for i, (ax, panel) in enumerate(placed):
        if panel.ylim is None and panel.ylabel in first:
            ax.sharey(first[panel.ylabel])
        first.setdefault(panel.ylabel, ax)
        left = placed[i - 1][1] if i % ncols else None
        if left is not None and (left.ylabel, left.ylim) == (panel.ylabel, panel.ylim):  # shared, or the same range
            ax.set_ylabel("")
            ax.tick_params(labelleft=False)


def _legend_columns(handles: list, width: float) -> int:
    """Two columns when the longest entry fits in half the width at the legend's font size, else one."""
    labels = [h.label if isinstance(h, Labelled) else h.get_label() for h in handles]
    em = (PAPER_FONT - 1) / 72  # inches
    longest = max((len(label) for label in labels), default=0) * 0.55 * em + 3.2 * em  # the text and the handle
    return 2 if len(labels) > 1 and 2 * longest + 1.2 * em <= width else 1


def _is_bottom(ax, grid, nrows: int, ncols: int, n_panels: int, multiples: bool) -> bool:
    """Whether ``ax`` is the lowest panel of its column (where the x label goes)."""
    for c in range(ncols):
        column = [grid[r][c] for r in range(nrows) if multiples or r * ncols + c < n_panels]
        if column and column[-1] is ax:
            return True
    return False


def _paper_handles(mpl, histories: list[History], drawn: set[str], styles: list[Style] | None) -> list:
    """The legend of a paper figure: what the colours and hatches mean (or, overlaid, the runs), and the extras."""
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    interval = interval_name(histories)
    keys = {k for k in drawn if not k.endswith(" interval") and (k in HEADLINE or k in SANITY or ":" in k)}
    banded = {k.removesuffix(" interval") for k in drawn if k.endswith(" interval")}
    handles = []
    if styles is not None:
        handles += [Line2D([], [], color=s.colour, marker=s.marker, markersize=3, linewidth=1.1, label=s.label)
                    for s in styles]
        followers = [k for k in keys if _role_of(k, keys) is CONTROL_ROLE]
        if followers:
            handles.append(Line2D([], [], color="0.3", linewidth=1.1, linestyle="--",
                                  label="dashed: " + _follower_name(followers)))
        if banded:
            handles.append(Patch(facecolor="0.3", alpha=0.15, linewidth=0, label=f"shaded: {interval}"))
    else:
        for role, members in ((ESTIMATE, [k for k in keys if _role_of(k, keys) is ESTIMATE]),
                              (CONTROL_ROLE, [k for k in keys if _role_of(k, keys) is CONTROL_ROLE])):
            if not members:
                continue
            name = _estimate_name(members) if role is ESTIMATE else _follower_name(members)
            line = Line2D([], [], color=role.colour, linestyle=role.linestyle, linewidth=1.1, marker=role.marker,
                          markersize=2.5, markerfacecolor=role.colour if role is ESTIMATE else "white")
            if banded & set(members):
                to_rgba = mpl.colors.to_rgba
                patch = Patch(facecolor=to_rgba(role.colour, 0.13), edgecolor=to_rgba(role.colour, HATCH_ALPHA),
                              hatch=role.hatch, linewidth=0)
                handles.append(Labelled((patch, line), f"{name}, {interval}"))
            else:
                handles.append(Labelled((line,), name))
    return handles + dose_handles(mpl, histories, colour="0.1")


def _role_of(key: str, keys: set[str]) -> Role:
    """The role ``key`` was drawn in: the control's for the control and a follower drawn with its lead."""
    return CONTROL_ROLE if key in CONTROL_KEYS or LEADS.get(key) in keys else ESTIMATE


def _estimate_name(members: list[str]) -> str:
    return {("score",): "score", ("yn_mass_mean",): "mean over prompts"}.get(tuple(members), "estimate")


def _follower_name(members) -> str:
    members = set(members)
    if members <= CONTROL_KEYS:
        return "Social Norms control"
    if members == {"yn_mass_min"}:
        return "minimum over prompts"
    return "control; min over prompts"
