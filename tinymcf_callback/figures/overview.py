"""The dashboard, the default figure of ``tinymcf plot``: every panel, several runs overlaid, 15 in wide.

A panel with no value says why instead of staying blank (docs/cli.md, "The dashboard").
"""

from __future__ import annotations

import math

import numpy as np

from ..data.sets import CONTROL
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from ..views.curves import FOUNDATION_METRICS, History, Series, subset_label
from .benchmark import draw_benchmark
from .drawing import (
    BAND_ALPHA,
    at_least,
    dose_handles,
    draw_not_answering,
    draw_random,
    draw_series,
    interval_name,
    legend,
    require_matplotlib,
    run_styles,
    x_label,
    x_locator,
    zero_line,
)

NCOLS = 4  # every row has four panel slots, so all panels have the same size; the top right one holds the legend


def _say_if_empty(ax, series: list[Series], why: str) -> None:
    """Write ``why`` across a panel that has no finite value to draw, instead of leaving it blank."""
    if not any(np.isfinite(s.est).any() for s in series):
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35", wrap=True)


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
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex or (axes[0] if axes else None), x_label(histories))
        zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            draw_random(ax, h, fields[0])
            for field in fields:
                draw_series(ax, h.steps, h.headline[field], style, field, dashed=field == "sn")
                draw_not_answering(ax, h, field, "0.1", size=7)
            if fields[0] == "score":
                draw_flags(ax, h, style)
        _say_if_empty(ax, [h.headline[f] for h in histories for f in fields], "no value at any step\n" + why)
        at_least(ax)
        axes.append(ax)
    return axes


def draw_flags(ax, h: History, style) -> None:
    """Where the score's change since step 0 is flagged: a ring around the point when its own step's p-value is
    below 1 - level, a black ring when the run-level p-value is too (a flag that holds over the whole run)."""
    step, run = h.flagged()
    score = h.headline["score"].est
    for where, colour, size, label in ((step & ~run, style.colour, 11, "change flagged at its step"),
                                       (run, "black", 13, "change flagged over the run")):
        if where.any():
            ax.plot(h.steps[where], score[where], linestyle="none", marker="o", markersize=size,
                    markerfacecolor="none", markeredgecolor=colour, markeredgewidth=1.4,
                    label=f"{style.label} · {label}")


def draw_foundations(subfig, histories, styles, sharex) -> list:
    """One panel per foundation present: ``align_other`` (solid) and ``align_self`` (dashed)."""
    names = list(dict.fromkeys(f for h in histories for f in h.foundations))
    nrows = max(1, math.ceil(len(names) / NCOLS))
    axes = []
    for slot, foundation in enumerate(names):
        title = f"{foundation} (control)" if foundation == CONTROL else foundation
        ax = _new_axes(subfig, slot, nrows, title, "alignment (−2..+2)", sharex, x_label(histories))
        zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            curves = h.foundations.get(foundation)
            if curves is not None:
                draw_random(ax, h, f"align_other:{foundation}")
                for metric in FOUNDATION_METRICS:  # align_self's band is left out: four bands per panel hide the curves
                    draw_series(ax, h.steps, curves[metric], style, metric, dashed=metric == "align_self",
                                band=metric == "align_other")
                    draw_not_answering(ax, h, f"{metric}:{foundation}", "0.1", size=7)
        at_least(ax)
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
        ax = _new_axes(subfig, slot, 1, title, ylabel, sharex, x_label(histories))
        if ylim[0] < 0:
            zero_line(ax)
        for h, style in zip(histories, styles, strict=True):
            draw_random(ax, h, keys[0])
            for key in keys:
                draw_series(ax, h.steps, Series(h.sanity[key]), style, key, dashed=key == "yn_mass_min")
                draw_not_answering(ax, h, key, "0.1", size=7)
        _say_if_empty(ax, [Series(h.sanity[k]) for h in histories for k in keys], "no value at any step")
        ax.set_ylim(*ylim)
        axes.append(ax)
    return axes


def draw_legend(subfig, mpl, histories, styles, extra=()) -> None:
    """The runs (colour and marker) and the line-style key, in the otherwise empty top right slot."""
    ax = subfig.add_subplot(1, NCOLS, NCOLS)
    ax.axis("off")
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    handles = [Line2D([], [], color=s.colour, marker=s.marker, linewidth=1.8, label=s.label) for s in styles]
    handles += [Line2D([], [], color="0.3", linewidth=1.8, label="solid: score, align_other"),
                Line2D([], [], color="0.3", linewidth=1.3, linestyle="--", label="dashed: control, align_self")]
    with_bands = [h for h in histories if any(s.lo is not None for s in _all_series(h))]
    if with_bands:
        handles.append(Patch(color="0.3", alpha=BAND_ALPHA * 2, label=f"shaded: {interval_name(with_bands)}"))
    flags = [h.flagged() for h in histories]
    if any(step.any() for step, _ in flags):
        alpha = 1.0 - (histories[0].level or 0.95)
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=9, markerfacecolor="none",
                              markeredgecolor="0.3", markeredgewidth=1.4,
                              label=f"ring: change since step 0 at p < {alpha:g} (that step alone)"))
    if any(run.any() for _, run in flags):
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=10, markerfacecolor="none",
                              markeredgecolor="black", markeredgewidth=1.4,
                              label=f"black ring: flagged over the run\n(run-level p < {alpha:g}: false flags held "
                                    f"to {alpha:g} over all steps)"))
    handles += dose_handles(mpl, histories, colour="0.1") + list(extra)
    legend(ax, handles, loc="center left", title="run (folder)" if len(styles) == 1 else "runs (folders)",
              fontsize=9, title_fontsize=9, frameon=False, alignment="left")


def _all_series(h: History):
    yield from h.headline.values()
    for curves in h.foundations.values():
        yield from curves.values()


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
    middle.suptitle("Per foundation: align_other (someone else acts, solid) and align_self (the reader acts, dashed)"
                    + few_vignettes_note(histories), fontsize=11, x=0.01, ha="left")
    fmt = answer_format_of(histories[0].answer_format)
    pos = fmt.shown[0]
    bottom.suptitle(f"Sanity: is P({pos}) read off most of the model's belief, and do the two questions agree?",
                    fontsize=11, x=0.01, ha="left")
    axes = draw_headline(top, histories, styles)
    bench = draw_benchmark(axes[0], histories, [s.colour for s in styles])  # its own axis over the score
    axes += draw_foundations(middle, histories, styles, sharex=axes[0])
    axes += draw_sanity(bottom, histories, styles, sharex=axes[0])
    for ax in axes:
        ax.xaxis.set_major_locator(x_locator(mpl, histories, nbins=6))
        if histories[0].x == "coefficient":
            ax.axvline(0.0, color="0.8", linewidth=0.8, zorder=0, label="_unsteered")
    draw_legend(top, mpl, histories, styles, bench)
    runs = f"{len(histories)} runs" if len(histories) > 1 else histories[0].label
    answers = "" if fmt.name == DEFAULT_ANSWER_FORMAT else f" ({'/'.join(fmt.shown)} answers)"  # json: true/false
    dose = ", dose response along the steering direction" if histories[0].x == "coefficient" else ""
    fig.suptitle((title or f"Moral-foundations probe on the {histories[0].name!r} vignettes{answers}: {runs}{dose}")
                 + "\n" + what_was_probed(histories), fontsize=13, fontweight="bold")
    return fig


def what_was_probed(histories: list[History]) -> str:
    """The vignettes and the precision each run's curve was scored with, for the figure's title."""
    parts = []
    for h in histories:
        precision = str(h.precision) if h.precision is not None else "precision not recorded"
        who = f"{h.label}: " if len(histories) > 1 else ""
        parts.append(f"{who}{subset_label(h.subset)}, {precision}")
    return "; ".join(parts)


def few_vignettes_note(histories: list[History]) -> str:
    """With two vignettes or fewer per foundation: what a foundation's band is, and what per_foundation=4 is for."""
    few = [h for h in histories if h.subset and isinstance(h.subset.get("per_foundation"), int)
           and h.subset["per_foundation"] <= 2]
    if not few or not any(s.lo is not None for h in few for c in h.foundations.values() for s in c.values()):
        return ""
    k = min(h.subset["per_foundation"] for h in few)
    return (f"\nper_foundation={k}: each foundation's band is a t interval over {k} vignette{'s' * (k != 1)} "
            f"(df = {max(k - 1, 0)}), wide and jumping between steps; per_foundation=4 (or the whole set) for "
            f"per-foundation intervals, the headline's holds over all foundations")
