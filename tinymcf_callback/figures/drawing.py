"""What the dashboard (:mod:`.overview`) and the paper figure (:mod:`.paper`) both draw with: Okabe-Ito colours and a
marker per run (a grey print still tells them apart), interval bands, a dose-response history's random directions.
Matplotlib is the optional ``[plot]`` extra, imported when a figure is made (:func:`require_matplotlib`).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes
from ..errors import HistoryError
from ..extras import require
from ..scoring.prompts import answer_format_of
from ..views.curves import History, Series

logger = logging.getLogger("tinymcf_callback")

FORMATS = ("png", "svg", "pdf")
# Okabe & Ito (2008), "Color Universal Design": distinct for protanopes, deuteranopes and tritanopes.
# Yellow (#F0E442) comes last: it is hard to see on white.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
RUN_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def require_matplotlib():
    """The matplotlib module with the submodules the figures use, or :class:`MissingExtraError` naming ``[plot]``."""
    mpl = require("matplotlib")
    for sub in ("colors", "figure", "lines", "patches", "ticker"):
        require(f"matplotlib.{sub}")
    return mpl


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
        draw_lone(ax, steps, series, style.colour, f"{style.label} · {what}", linewidth=3)


def draw_lone(ax, steps: np.ndarray, series: Series, colour: str, label: str, *, linewidth: float) -> None:
    """A bar for each interval whose neighbours' are not known: a band needs two neighbouring steps."""
    known = np.isfinite(series.lo) & np.isfinite(series.hi)
    alone = known & ~np.concatenate([[False], known[:-1]]) & ~np.concatenate([known[1:], [False]])
    if alone.any():
        ax.vlines(steps[alone], series.lo[alone], series.hi[alone], color=colour, alpha=0.5, linewidth=linewidth,
                  label=f"{label} lone interval")


def zero_line(ax) -> None:
    ax.axhline(0.0, color="0.55", linewidth=0.8, zorder=0, label="_zero")


MIN_SPAN = 0.2  # alignment units: a change of 1e-5 (random weights) must look flat, not like a trend


def at_least(ax, span: float = MIN_SPAN) -> None:
    """Widen the y range to ``span`` around its middle, so that noise-sized changes look as small as they are."""
    lo, hi = ax.get_ylim()
    if hi - lo < span:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - span / 2, mid + span / 2)


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


def x_label(histories: list[History]) -> str:
    return "steering coefficient" if histories[0].x == "coefficient" else "training step"


def dose_handles(mpl, histories: list[History], colour: str = "0.3") -> list:
    """Legend entries for the random directions' band and median and the not-answering marker, where drawn."""
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    ks = sorted({len(h.random) for h in histories if h.random})
    handles = []
    if ks:
        k = "/".join(str(k) for k in ks)
        handles.append(Labelled((Patch(facecolor=RANDOM_GREY, alpha=0.3, linewidth=0),
                                  Line2D([], [], color=RANDOM_GREY, linewidth=0.8)),
                                 f"random directions (k={k})"))
    if any(h.answering is not None and not h.answering.all() for h in histories):
        handles.append(Line2D([], [], linestyle="none", marker=NOT_ANSWERING, markeredgewidth=1.2, color=colour,
                              label=f"not answering ({mass_name(histories)} < 0.5)"))
    return handles


@dataclass(frozen=True)
class Labelled:
    """A tuple legend handle (drawn on top of each other) with its label; :func:`legend` unpacks it."""

    handle: tuple
    label: str


def legend(target, handles: list, **kwargs):
    """``target.legend`` with :class:`Labelled` tuple handles unpacked into (handles, labels)."""
    hs = [h.handle if isinstance(h, Labelled) else h for h in handles]
    labels = [h.label if isinstance(h, Labelled) else h.get_label() for h in handles]
    return target.legend(hs, labels, **kwargs)


def interval_name(histories: list[History]) -> str:
    """``95% interval`` when every history says the same level, else ``interval``."""
    levels = {h.level for h in histories}
    return f"{levels.pop():.0%} interval" if len(levels) == 1 and None not in levels else "interval"


def mass_name(histories: list[History]) -> str:
    pos, neg = answer_format_of(histories[0].answer_format).shown
    return f"{pos}+{neg} mass"


def x_locator(mpl, histories: list[History], nbins: int):
    if histories[0].x == "coefficient":
        return mpl.ticker.MaxNLocator(nbins=nbins)
    return mpl.ticker.MaxNLocator(nbins=nbins, integer=True, steps=[1, 2, 5, 10])


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
