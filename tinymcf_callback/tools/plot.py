"""Draw the probe's curves: ``python -m tinymcf_callback.plot HISTORY.jsonl [MORE.jsonl ...] [--out curves.png]``.

Reads the JSONL histories that ``MoralProbeCallback`` appends (``<output_dir>/moral_probe_<name>.jsonl``,
one line per probe) and draws, against the training step (a dose-response history: against the
steering coefficient, below): the headline score with the Social Norms control, the score minus the
control and the self-other gap; ``align_other`` and ``align_self`` per
foundation; and the sanity figures (``yn_mass``, frame agreement, correlation with human ratings when
the set has them). Where a line carries interval bounds (``score_lo``/``score_hi`` at the top level,
``align_other_lo``/``align_other_hi`` in a table row, ...) the interval is a shaded band; a history
without them is drawn without bands. Several runs of the same set share one figure, one colour (and
marker) each, labelled with the run folder's name. Histories of different answer formats (Yes/No, JSON
true/false: the line's ``answer_format``, Yes/No when absent) never share a file or a figure.

Reading the histories needs only numpy; drawing needs matplotlib, the optional ``[plot]`` extra,
imported when a figure is made. Colours are the Okabe-Ito palette, chosen to stay distinct under
the common colour-vision deficiencies; each run also gets its own marker, so a grey print still
tells runs apart.

Two kinds of figure (:func:`draw`):

* the **dashboard** (the default): every panel, several runs overlaid, 15 in wide, for looking at a run;
* a **paper figure** (``panels`` other than ``"dashboard"``, or ``metrics``): the chosen panel groups
  (``headline``, ``foundations``, ``sanity``) or metrics only, one journal column wide (``width``,
  3.4 in by default), 8 pt text, the estimate in blue with a ``///``-hatched interval and the Social
  Norms control in orange with a ``\\\\\\``-hatched one, a zero line, axis labels and one legend below.
  A metric with no value at any point of any run is left out (with a warning), never drawn blank.
  Several runs are small multiples, one column per run with a shared y axis per row
  (``overlay=True``: on one axis, one colour per run, lighter bands without hatching).

Both draw a training history against the step, or a dose-response history
(``moral_probe_<name>_dose.jsonl``, ``x="coefficient"`` when loading) against the steering
coefficient: the real direction's curve with its interval, the random directions' range as a grey
band with their median as a thin grey line, and an ``x`` where the model stopped answering.

Which line is drawn when a history repeats itself (both rules are documented in the README):

* a ``train_begin`` line after other lines is the step-0 baseline of a new run written into the same
  output folder: the earlier lines belong to the previous run and are dropped, with a warning;
* a step logged more than once (a run resumed from an earlier checkpoint re-probes the steps after
  it): the last line in the file wins, with a warning.
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes
from ..data.sets import CONTROL
from ..errors import HistoryError, MissingExtraError
from ..extras import require
from ..results.curves import (
    FOUNDATION_METRICS,
    HEADLINE,
    SANITY,
    History,
    PlotOptionError,
    Series,
    foundation_order,
    load_histories,
    metric_key,
)
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of

logger = logging.getLogger("tinymcf_callback")

FORMATS = ("png", "svg", "pdf")
# Okabe & Ito (2008), "Color Universal Design": distinct for protanopes, deuteranopes and tritanopes.
# Yellow (#F0E442) comes last: it is hard to see on white.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
RUN_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


# ---- drawing (matplotlib) --------------------------------------------------------------------------
def require_matplotlib():
    """The matplotlib module with the submodules the figures use, or :class:`MissingExtraError` naming ``[plot]``."""
    mpl = require("matplotlib")
    for sub in ("colors", "figure", "lines", "patches", "ticker"):
        require(f"matplotlib.{sub}")
    return mpl


MissingPlotExtraError = MissingExtraError  # the name this error had before every extra went through extras.require


NCOLS = 4  # every row has four panel slots, so all panels have the same size; the top right one holds the legend
BAND_ALPHA = 0.15


@dataclass(frozen=True)
class Style:
    """How one run looks: its colour and marker."""

    label: str
    colour: str
    marker: str


def run_styles(histories: list[History]) -> list[Style]:
    if len(histories) > len(RUN_COLOURS):
        logger.warning("%d runs in one figure: colours and markers repeat after %d runs", len(histories),
                       len(RUN_COLOURS))
    return [Style(h.label, RUN_COLOURS[i % len(RUN_COLOURS)], RUN_MARKERS[i % len(RUN_MARKERS)])
            for i, h in enumerate(histories)]


def draw_series(ax, steps: np.ndarray, series: Series, style: Style, what: str, *, dashed: bool = False,
                band: bool = True) -> None:
    """One run's curve (label ``"<run> · <what>"``) and, when the series has bounds and ``band``, its interval.

    The interval is a translucent band in the run's colour with thin edges, so overlapping bands of
    several runs stay readable.
    """
    ax.plot(steps, series.est, color=style.colour, marker=style.marker, markersize=4 if dashed else 5,
            linestyle="--" if dashed else "-", linewidth=1.3 if dashed else 1.8,
            markerfacecolor="white" if dashed else style.colour, label=f"{style.label} · {what}")
    if band and series.lo is not None and series.hi is not None:
        ax.fill_between(steps, series.lo, series.hi, facecolor=style.colour, alpha=BAND_ALPHA, linewidth=0,
                        label=f"{style.label} · {what} interval")
        for bound in (series.lo, series.hi):
            ax.plot(steps, bound, color=style.colour, linewidth=0.6, alpha=0.6, linestyle="--" if dashed else "-",
                    label=f"_{style.label} · {what} bound")
        alone = _isolated(series.lo, series.hi)  # a band needs two neighbouring steps: a lone interval is a bar
        if alone.any():
            ax.vlines(steps[alone], series.lo[alone], series.hi[alone], color=style.colour, alpha=0.5, linewidth=3,
                      label=f"{style.label} · {what} lone interval")


def _isolated(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Steps whose interval is known but whose neighbours' are not (invisible as a band)."""
    known = np.isfinite(lo) & np.isfinite(hi)
    before = np.concatenate([[False], known[:-1]])
    after = np.concatenate([known[1:], [False]])
    return known & ~before & ~after


def _zero_line(ax) -> None:
    ax.axhline(0.0, color="0.55", linewidth=0.8, zorder=0, label="_zero")


MIN_SPAN = 0.2  # alignment units: a change of 1e-5 (random weights) must look flat, not like a trend


def _at_least(ax, span: float = MIN_SPAN) -> None:
    """Widen the y range to ``span`` around its middle, so that noise-sized changes look as small as they are."""
    lo, hi = ax.get_ylim()
    if hi - lo < span:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - span / 2, mid + span / 2)


def _say_if_empty(ax, series: list[Series], why: str) -> None:
    """Write ``why`` across a panel that has no finite value to draw, instead of leaving it blank."""
    if not any(np.isfinite(s.est).any() for s in series):
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35", wrap=True)


RANDOM_GREY = "0.55"  # the random directions' band and median
NOT_ANSWERING = "x"  # the marker of a coefficient where the model stopped answering (Yes+No mass < 0.5)


def draw_random(ax, h: History, key: str, *, linewidth: float = 0.8) -> None:
    """The random directions' range of ``key`` (grey band, min to max) and their median (thin grey line)."""
    env = h.random_envelope(key)
    if env is None or not np.isfinite(env.median).any():
        return
    ax.fill_between(env.x, env.lo, env.hi, facecolor=RANDOM_GREY, alpha=0.3, linewidth=0, zorder=1,
                    label=f"{h.label} · {key} random directions (k={env.k})")
    ax.plot(env.x, env.median, color=RANDOM_GREY, linewidth=linewidth, zorder=1.5,
            label=f"{h.label} · {key} random median")


def draw_not_answering(ax, h: History, key: str, colour: str, *, size: float = 6) -> None:
    """An ``x`` on the curve of ``key`` where the model stopped answering (the line says ``"answering": false``)."""
    if h.answering is None or h.answering.all():
        return
    off = ~h.answering
    ax.plot(h.steps[off], h.series(key).est[off], linestyle="none", marker=NOT_ANSWERING, markersize=size,
            markeredgewidth=1.2, color=colour, zorder=4, label=f"{h.label} · {key} not answering")


def _x_label(histories: list[History]) -> str:
    return "steering coefficient" if histories[0].x == "coefficient" else "training step"


def _new_axes(subfig, slot: int, nrows: int, title: str, ylabel: str, sharex, xlabel: str = "training step"):
    ax = subfig.add_subplot(nrows, NCOLS, slot + 1, sharex=sharex)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, color="0.92", linewidth=0.6)
    return ax


def draw_headline(subfig, histories, styles, sharex=None) -> list:
    """Score with its control, score minus control, and the self-other gap (three panels)."""
    no_real = "(no real foundation probed)"
    specs = [("Score (solid) and Social Norms control (dashed)", "align_other (−2..+2)", ("score", "sn"), no_real),
             ("Score minus Social Norms control", "score − control", ("score_minus_sn",),
              "(needs Social Norms vignettes: a --limit\nor a set without them leaves them out)"),
             ("Self-other gap", "align_other − align_self", ("gap",), no_real)]
    axes = []
    for slot, (title, ylabel, fields, why) in enumerate(specs):
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex or (axes[0] if axes else None), _x_label(histories))
        _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            draw_random(ax, h, fields[0])
            for field in fields:
                draw_series(ax, h.steps, h.headline[field], style, field, dashed=field == "sn")
                draw_not_answering(ax, h, field, "0.1", size=7)
        _say_if_empty(ax, [h.headline[f] for h in histories for f in fields], "no value at any step\n" + why)
        _at_least(ax)
        axes.append(ax)
    return axes


def draw_foundations(subfig, histories, styles, sharex) -> list:
    """One panel per foundation present: ``align_other`` (solid) and ``align_self`` (dashed)."""
    names = list(dict.fromkeys(f for h in histories for f in h.foundations))
    nrows = max(1, math.ceil(len(names) / NCOLS))
    axes = []
    for slot, foundation in enumerate(names):
        title = f"{foundation} (control)" if foundation == CONTROL else foundation
        ax = _new_axes(subfig, slot, nrows, title, "alignment (−2..+2)", sharex, _x_label(histories))
        _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            curves = h.foundations.get(foundation)
            if curves is not None:
                draw_random(ax, h, f"align_other:{foundation}")
                for metric in FOUNDATION_METRICS:  # align_self's band is left out: four bands per panel hide the curves
                    draw_series(ax, h.steps, curves[metric], style, metric, dashed=metric == "align_self",
                                band=metric == "align_other")
                    draw_not_answering(ax, h, f"{metric}:{foundation}", "0.1", size=7)
        _at_least(ax)
        axes.append(ax)
    return axes


def draw_sanity(subfig, histories, styles, sharex) -> list:
    """Answer mass (Yes+No or true+false; mean solid, min dashed), frame agreement, human correlation when present."""
    pos, neg = answer_format_of(histories[0].answer_format).shown
    specs = [(f"{pos}+{neg} mass: mean (solid), min (dashed)", f"P({pos}) + P({neg})",
              ("yn_mass_mean", "yn_mass_min"), (0.0, 1.05)),
             ("Frame agreement (+1: the two questions agree)", f"corr(P({pos}|wrong?), P({neg}|ok?))",
              ("frame_agreement",), (-1.05, 1.05))]
    if any(np.isfinite(h.sanity["human_corr"]).any() for h in histories):
        specs.append(("Correlation with human wrongness ratings", "Pearson r", ("human_corr",), (-1.05, 1.05)))
    axes = []
    for slot, (title, ylabel, keys, ylim) in enumerate(specs):
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex, _x_label(histories))
        if ylim[0] < 0:
            _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            draw_random(ax, h, keys[0])
            for key in keys:
                draw_series(ax, h.steps, Series(h.sanity[key]), style, key, dashed=key == "yn_mass_min")
                draw_not_answering(ax, h, key, "0.1", size=7)
        _say_if_empty(ax, [Series(h.sanity[k]) for h in histories for k in keys], "no value at any step")
        ax.set_ylim(*ylim)
        axes.append(ax)
    return axes


def draw_legend(subfig, mpl, histories, styles) -> None:
    """The runs (colour and marker) and the line-style key, in the otherwise empty top right slot."""
    ax = subfig.add_subplot(1, NCOLS, NCOLS)
    ax.axis("off")
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    handles = [Line2D([], [], color=s.colour, marker=s.marker, linewidth=1.8, label=s.label) for s in styles]
    handles += [Line2D([], [], color="0.3", linewidth=1.8, label="solid: score, align_other"),
                Line2D([], [], color="0.3", linewidth=1.3, linestyle="--", label="dashed: control, align_self")]
    with_bands = [h for h in histories if any(s.lo is not None for s in _all_series(h))]
    if with_bands:
        levels = {h.level for h in with_bands}
        level = levels.pop() if len(levels) == 1 else None
        name = f"{level:.0%} interval" if level is not None else "interval"
        handles.append(Patch(color="0.3", alpha=BAND_ALPHA * 2, label=f"shaded: {name}"))
    handles += _dose_handles(mpl, histories, colour="0.1")
    _legend(ax, handles, loc="center left", title="run (folder)" if len(styles) == 1 else "runs (folders)",
              fontsize=9, title_fontsize=9, frameon=False, alignment="left")


def _all_series(h: History):
    yield from h.headline.values()
    for curves in h.foundations.values():
        yield from curves.values()


def _dose_handles(mpl, histories: list[History], colour: str = "0.3") -> list:
    """Legend entries for the random directions' band and median and the not-answering marker, where drawn."""
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    ks = sorted({len(h.random) for h in histories if h.random})
    handles = []
    if ks:
        k = "/".join(str(k) for k in ks)
        handles.append(_Labelled((Patch(facecolor=RANDOM_GREY, alpha=0.3, linewidth=0),
                                  Line2D([], [], color=RANDOM_GREY, linewidth=0.8)),
                                 f"random directions (k={k})"))
    if any(h.answering is not None and not h.answering.all() for h in histories):
        handles.append(Line2D([], [], linestyle="none", marker=NOT_ANSWERING, markeredgewidth=1.2, color=colour,
                              label=f"not answering ({_mass_name(histories)} < 0.5)"))
    return handles


@dataclass(frozen=True)
class _Labelled:
    """A tuple legend handle (drawn on top of each other) with its label; :func:`_legend` unpacks it."""

    handle: tuple
    label: str


def _legend(target, handles: list, **kwargs):
    """``target.legend`` with :class:`_Labelled` tuple handles unpacked into (handles, labels)."""
    hs = [h.handle if isinstance(h, _Labelled) else h for h in handles]
    labels = [h.label if isinstance(h, _Labelled) else h.get_label() for h in handles]
    return target.legend(hs, labels, **kwargs)


def _mass_name(histories: list[History]) -> str:
    pos, neg = answer_format_of(histories[0].answer_format).shown
    return f"{pos}+{neg} mass"


def draw_dashboard(histories: list[History], *, title: str | None = None):
    """The dashboard of ``histories`` (already loaded, same set): headline, per-foundation and sanity panels."""
    mpl = require_matplotlib()
    styles = run_styles(histories)
    n_found = len({f for h in histories for f in h.foundations})
    found_rows = max(1, math.ceil(n_found / NCOLS))
    fig = mpl.figure.Figure(figsize=(15, 3.1 * (2 + found_rows) + 0.6), layout="constrained")
    top, middle, bottom = fig.subfigures(3, 1, height_ratios=[1, found_rows, 1])
    top.suptitle("Headline: score = mean align_other over the real foundations probed; Social Norms is the "
                 "negative control", fontsize=11, x=0.01, ha="left")
    middle.suptitle("Per foundation: align_other (someone else acts, solid) and align_self (the reader acts, dashed)",
                    fontsize=11, x=0.01, ha="left")
    pos = answer_format_of(histories[0].answer_format).shown[0]
    bottom.suptitle(f"Sanity: is P({pos}) read off most of the model's belief, and do the two questions agree?",
                    fontsize=11, x=0.01, ha="left")
    axes = draw_headline(top, histories, styles)
    axes += draw_foundations(middle, histories, styles, sharex=axes[0])
    axes += draw_sanity(bottom, histories, styles, sharex=axes[0])
    for ax in axes:
        ax.xaxis.set_major_locator(_x_locator(mpl, histories, nbins=6))
        if histories[0].x == "coefficient":
            ax.axvline(0.0, color="0.8", linewidth=0.8, zorder=0, label="_unsteered")
    draw_legend(top, mpl, histories, styles)
    runs = f"{len(histories)} runs" if len(histories) > 1 else histories[0].label
    answers = "" if histories[0].answer_format == DEFAULT_ANSWER_FORMAT else " (JSON true/false answers)"
    dose = ", dose response along the steering direction" if histories[0].x == "coefficient" else ""
    fig.suptitle(title or f"Moral-foundations probe on the {histories[0].name!r} vignettes{answers}: {runs}{dose}",
                 fontsize=13, fontweight="bold")
    return fig


def _x_locator(mpl, histories: list[History], nbins: int):
    if histories[0].x == "coefficient":
        return mpl.ticker.MaxNLocator(nbins=nbins)
    return mpl.ticker.MaxNLocator(nbins=nbins, integer=True, steps=[1, 2, 5, 10])


# ---- paper figures ---------------------------------------------------------------------------------------
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
    metric names (:func:`~tinymcf_callback.results.curves.metric_key`). Both given: the groups' metrics,
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
    alone = _isolated(series.lo, series.hi)
    if alone.any():
        ax.vlines(x[alone], series.lo[alone], series.hi[alone], color=colour, alpha=0.5, linewidth=2.5,
                  label=f"{h.label} · {key} lone interval")
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
        _zero_line(ax)
    if histories[0].x == "coefficient":
        ax.axvline(0.0, color="0.85", linewidth=0.6, zorder=0, label="_unsteered")
    ax.xaxis.set_major_locator(_x_locator(mpl, histories, nbins=4))
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
    placed = []  # (axes, panel) in drawing order
    for i, panel in enumerate(panels):
        cells = [(i, j) for j in range(ncols)] if multiples else [divmod(i, ncols)]
        for run, (r, c) in enumerate(cells):
            ax = grid[r][c]
            runs = [histories[run]] if multiples else histories
            _style_axes(ax, mpl, histories, panel)
            for h, style in zip(runs, [styles[run]] if multiples else styles, strict=True):
                drawn |= _draw_paper_panel(ax, mpl, h, panel, style=style)
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
            _at_least(ax)
        if _is_bottom(ax, grid, nrows, ncols, len(panels), multiples):
            ax.set_xlabel(_x_label(histories), fontsize=PAPER_FONT)
    handles = _paper_handles(mpl, histories, drawn, styles if overlay else None)
    legend_cols = _legend_columns(handles, width)
    if handles:
        _legend(fig, handles, loc="outside lower center", ncols=legend_cols, fontsize=PAPER_FONT - 1, frameon=False,
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
    labels = [h.label if isinstance(h, _Labelled) else h.get_label() for h in handles]
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


def _interval_name(histories: list[History]) -> str:
    levels = {h.level for h in histories}
    return f"{levels.pop():.0%} interval" if len(levels) == 1 and None not in levels else "interval"


def _paper_handles(mpl, histories: list[History], drawn: set[str], styles: list[Style] | None) -> list:
    """The legend of a paper figure: what the colours and hatches mean (or, overlaid, the runs), and the extras."""
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    interval = _interval_name(histories)
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
                handles.append(_Labelled((patch, line), f"{name}, {interval}"))
            else:
                handles.append(_Labelled((line,), name))
    return handles + _dose_handles(mpl, histories, colour="0.1")


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


def draw(histories: list[History], *, title: str | None = None, panels=None, metrics=None, width: float | None = None,
         overlay: bool = False):
    """The figure of ``histories`` (already loaded, same set and x axis): the dashboard, or a paper figure.

    ``panels``: ``"dashboard"`` (the default) or panel groups ``headline``, ``foundations``, ``sanity``
    (comma-separated or a list); ``metrics``: metric names (comma-separated or a list). Either of
    the latter draws a paper figure ``width`` inches wide (default 3.4); ``overlay``: its runs on one
    axis instead of one column each. Raises :class:`PlotOptionError` for an option it cannot use.
    """
    keys = chosen_metrics(histories, panels, metrics)
    if keys is None:
        if width is not None:
            raise PlotOptionError("--width sets a paper figure's width: add --panels headline, foundations or "
                                  "sanity, or --metrics (the dashboard is 15 in wide)")
        return draw_dashboard(histories, title=title)
    return draw_paper(histories, keys, title=title, width=width, overlay=overlay)


def is_paper(panels=None, metrics=None) -> bool:
    """Whether these options draw a paper figure (not the dashboard)."""
    groups = split_names(panels)
    return bool(split_names(metrics)) or bool(groups and groups != ["dashboard"])


def image_format(out: str | Path) -> str:
    """``png``, ``svg`` or ``pdf`` from the suffix of ``out``; refuses any other."""
    fmt = Path(out).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise HistoryError(f"cannot tell the image format of {out}: end --out with .png, .svg or .pdf")
    return fmt


def save_figure(fig, out: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``out`` (PNG, SVG or PDF by its suffix) atomically."""
    fmt = image_format(out)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return atomic_write_bytes(out, buf.getvalue())


def plot_histories(paths, out: str | Path | None = None, *, title: str | None = None, panels=None, metrics=None,
                   width: float | None = None, overlay: bool = False, x: str = "step"):
    """Draw one or more histories of the same vignette set; returns the matplotlib ``Figure``.

    ``paths``: history files (``moral_probe_<name>.jsonl``) or run folders holding one. ``out``: also
    write the figure there (``.png``, ``.svg`` or ``.pdf``; a paper figure's PNG at 300 dpi). In a
    notebook the returned figure shows inline. ``panels``, ``metrics``, ``width``, ``overlay``: as
    :func:`draw` (the CLI's ``--panels``, ``--metrics``, ``--width``, ``--overlay``); ``x``: ``"step"``
    (training histories) or ``"coefficient"`` (dose-response histories, ``moral_probe_<name>_dose.jsonl``).
    Raises :class:`HistoryError` for bad input, :class:`PlotOptionError` for an option it cannot use and
    :class:`MissingExtraError` without matplotlib.
    """
    if out is not None:
        image_format(out)  # a wrong suffix fails before the drawing
    histories = load_histories(paths, x=x)
    fig = draw(histories, title=title, panels=panels, metrics=metrics, width=width, overlay=overlay)
    if out is not None:
        save_figure(fig, out, dpi=PAPER_DPI if is_paper(panels, metrics) else 100)
    return fig


def default_out(histories: list[History], tag: str | None = None) -> Path:
    """One history: next to it, ``moral_probe_<name>.png``; several: that name in the current folder.

    ``tag``: a paper figure's name, added as ``moral_probe_<name>_<tag>.png`` so it does not replace the dashboard.
    """
    first = histories[0].path
    png = first.with_name(f"{first.stem}_{tag}.png") if tag else first.with_suffix(".png")
    return png if len(histories) == 1 else Path(png.name)
