"""The figure a tracker gets at each probe: the curve so far, with its intervals, and the foundations.

Dashboards other than TensorBoard draw lines without bands; a picture per probe shows the band everywhere. It is
paid at every probe, inside the training, so it is kept cheap on purpose: two axes, no layout engine (which alone
costs more than the drawing), 80 dpi, margins widened only when a label would not fit (:func:`_fit`). What it
costs: docs/dashboards.md, "What the figure costs".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.sets import CONTROL
from ..stats.metrics import probe_key
from ..views.curves import History, history_of
from .drawing import RUN_COLOURS, RUN_MARKERS, Style, at_least, draw_series, require_matplotlib, zero_line

SIZE = (10.0, 3.6)  # inches
DPI = 80  # 800 x 288 pixels: readable in a dashboard's media panel, cheap to draw
SCORE, CONTROL_COLOUR = RUN_COLOURS[0], RUN_COLOURS[1]
FOUNDATION_BAND_ALPHA = 0.07
MARGINS = {"left": 0.06, "right": 0.83, "bottom": 0.14, "top": 0.82, "wspace": 0.22}  # fit the usual labels
PAD = 3.0  # pixels kept between a label and the figure's edge (or the other panel)


def probe_figure(lines: list[dict], history: Path, label: str | None = None) -> np.ndarray:
    """The figure of the curve so far (``lines``: the history lines logged so far, this probe's last) as an RGB
    image, ``uint8`` of shape (height, width, 3). Needs matplotlib (the ``[plot]`` extra)."""
    h = history_of(lines, history, label)
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI)
    fig.subplots_adjust(**MARGINS)
    headline, foundations = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2, sharex=None)
    _headline(headline, h)
    _foundations(foundations, h)
    title = fig.suptitle(_title(h), fontsize=10, x=0.01, ha="left")
    canvas = FigureCanvasAgg(fig)
    _fit_title(fig, canvas.get_renderer(), title)
    _fit(fig, canvas.get_renderer(), headline, foundations)
    canvas.draw()
    return np.array(canvas.buffer_rgba())[..., :3]


def _fit_title(fig, renderer, title) -> None:
    """A title wider than the figure (a long run folder name) goes on two lines, split at its middle ``·``, the
    panels moved down to make room; the title keeps its size."""
    if title.get_window_extent(renderer).x1 <= fig.bbox.width - PAD:
        return
    parts = title.get_text().split(" · ")
    half = (len(parts) + 1) // 2
    title.set_text(" · ".join(parts[:half]) + "\n" + " · ".join(parts[half:]))
    fig.subplots_adjust(top=MARGINS["top"] - 0.08)


def _fit(fig, renderer, left, right) -> None:
    """Widen the margins (and the gap between the panels) by what the labels need beyond them: the tick labels'
    widths depend on the values (``0.0125`` is wider than ``0.1``), and a fixed margin clips a wide one. The labels'
    extents are measured without drawing; the usual figure needs nothing and keeps :data:`MARGINS`."""
    width, height = fig.bbox.width, fig.bbox.height
    a, b = left.get_tightbbox(renderer), right.get_tightbbox(renderer)
    out_left = max(0.0, PAD - a.x0) / width  # the headline's y label and ticks past the left edge
    out_right = max(0.0, b.x1 - (width - PAD)) / width  # the legend past the right edge
    out_bottom = max(0.0, PAD - min(a.y0, b.y0)) / height
    overlap = max(0.0, a.x1 + PAD - b.x0) / width  # the foundations' tick labels into the headline panel
    if not (out_left or out_right or out_bottom or overlap):
        return
    params = fig.subplotpars
    axes_width = (params.right - params.left - out_left - out_right) / (2 + params.wspace)
    fig.subplots_adjust(left=params.left + out_left, right=params.right - out_right,
                        bottom=params.bottom + out_bottom, wspace=params.wspace + overlap / max(axes_width, 1e-3))


def _axes(ax, title: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, color="0.92", linewidth=0.6)
    zero_line(ax)


def _headline(ax, h: History) -> None:
    _axes(ax, "score (solid) and Social Norms control (dashed)")
    draw_series(ax, h.steps, h.headline["score"], Style("score", SCORE, "o"), "score")
    draw_series(ax, h.steps, h.headline["sn"], Style("control", CONTROL_COLOUR, "s"), "sn", dashed=True)
    ax.set_ylabel("align_other (−2..+2)", fontsize=8)
    at_least(ax)


def _foundations(ax, h: History) -> None:
    _axes(ax, "align_other per foundation")
    for i, (foundation, curves) in enumerate(h.foundations.items()):
        style = Style(foundation, RUN_COLOURS[i % len(RUN_COLOURS)], RUN_MARKERS[i % len(RUN_MARKERS)])
        series = curves["align_other"]
        draw_series(ax, h.steps, series, style, "align_other", dashed=foundation == CONTROL, band=False)
        if series.lo is not None:  # seven bands overlap: lighter than a lone curve's
            ax.fill_between(h.steps, series.lo, series.hi, facecolor=style.colour, alpha=FOUNDATION_BAND_ALPHA,
                            linewidth=0)
    at_least(ax)
    handles = [line for line in ax.get_lines() if line.get_label().endswith("· align_other")]
    ax.legend(handles, [line.get_label().split(" · ")[0] for line in handles], fontsize=7, frameon=False,
              loc="center left", bbox_to_anchor=(1.01, 0.5))


def _title(h: History) -> str:
    score = h.headline["score"]
    last = len(h.steps) - 1
    bounds = ""
    if score.lo is not None and np.isfinite(score.lo[last]) and np.isfinite(score.hi[last]):
        bounds = f" [{score.lo[last]:+.3f}, {score.hi[last]:+.3f}]"
    level = f"{h.level:.0%} intervals shaded" if h.level else "no intervals (n_resamples=0)"
    return (f"moral probe {probe_key(h.name, h.answer_format)} · {h.label} · training step {h.steps[last]:g}: score "
            f"{score.est[last]:+.3f}{bounds} · {level}")
