"""Draw the probe's curves: ``python -m tinymcf_callback.plot HISTORY.jsonl [MORE.jsonl ...] [--out curves.png]``.

Reads the JSONL histories that ``MoralProbeCallback`` appends (``<output_dir>/moral_probe_<name>.jsonl``,
one line per probe) and draws, against the training step: the headline score with the Social Norms
control, the score minus the control and the self-other gap; ``align_other`` and ``align_self`` per
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
from ..results.curves import FOUNDATION_METRICS, History, Series, load_histories
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
    for sub in ("figure", "lines", "patches", "ticker"):
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


def _new_axes(subfig, slot: int, nrows: int, title: str, ylabel: str, sharex):
    ax = subfig.add_subplot(nrows, NCOLS, slot + 1, sharex=sharex)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_xlabel("training step", fontsize=9)
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
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex or (axes[0] if axes else None))
        _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            for field in fields:
                draw_series(ax, h.steps, h.headline[field], style, field, dashed=field == "sn")
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
        ax = _new_axes(subfig, slot, nrows, title, "alignment (−2..+2)", sharex)
        _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            curves = h.foundations.get(foundation)
            if curves is not None:
                for metric in FOUNDATION_METRICS:  # align_self's band is left out: four bands per panel hide the curves
                    draw_series(ax, h.steps, curves[metric], style, metric, dashed=metric == "align_self",
                                band=metric == "align_other")
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
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex)
        if ylim[0] < 0:
            _zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            for key in keys:
                draw_series(ax, h.steps, Series(h.sanity[key]), style, key, dashed=key == "yn_mass_min")
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
    ax.legend(handles=handles, loc="center left", title="run (folder)" if len(styles) == 1 else "runs (folders)",
              fontsize=9, title_fontsize=9, frameon=False, alignment="left")


def _all_series(h: History):
    yield from h.headline.values()
    for curves in h.foundations.values():
        yield from curves.values()


def draw(histories: list[History], *, title: str | None = None):
    """The figure of ``histories`` (already loaded, same set): headline, per-foundation and sanity panels."""
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
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=6, integer=True, steps=[1, 2, 5, 10]))
    draw_legend(top, mpl, histories, styles)
    runs = f"{len(histories)} runs" if len(histories) > 1 else histories[0].label
    answers = "" if histories[0].answer_format == DEFAULT_ANSWER_FORMAT else " (JSON true/false answers)"
    fig.suptitle(title or f"Moral-foundations probe on the {histories[0].name!r} vignettes{answers}: {runs}",
                 fontsize=13, fontweight="bold")
    return fig


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


def plot_histories(paths, out: str | Path | None = None, *, title: str | None = None):
    """Draw one or more histories of the same vignette set; returns the matplotlib ``Figure``.

    ``paths``: history files (``moral_probe_<name>.jsonl``) or run folders holding one. ``out``: also
    write the figure there (``.png``, ``.svg`` or ``.pdf``). In a notebook the returned figure shows inline.
    Raises :class:`HistoryError` for bad input and :class:`MissingExtraError` without matplotlib.
    """
    if out is not None:
        image_format(out)  # a wrong suffix fails before the drawing
    histories = load_histories(paths)
    fig = draw(histories, title=title)
    if out is not None:
        save_figure(fig, out)
    return fig


def default_out(histories: list[History]) -> Path:
    """One history: next to it, ``moral_probe_<name>.png``; several: that name in the current folder."""
    first = histories[0].path
    return first.with_suffix(".png") if len(histories) == 1 else Path(first.with_suffix(".png").name)
