"""Draw the probe's curves: ``tinymcf plot HISTORY.jsonl [MORE.jsonl ...] [--out curves.png]``; from Python,
:func:`plot_histories`.

Two kinds of figure (:func:`draw`): the dashboard (:mod:`.overview`) and a paper figure (:mod:`.paper`). Drawing
needs matplotlib, the optional ``[plot]`` extra. What each figure shows: docs/cli.md, ``tinymcf plot``.
"""

from __future__ import annotations

from pathlib import Path

from ..views.curves import History, PlotOptionError, load_histories
from .benchmark import benchmark_points
from .drawing import image_format, save_figure
from .overview import draw_dashboard
from .paper import PAPER_DPI, chosen_metrics, draw_paper, split_names


def draw(histories: list[History], *, title: str | None = None, panels=None, metrics=None, width: float | None = None,
         overlay: bool = False):
    """The figure of ``histories`` (already loaded, same set and x axis): the dashboard, or a paper figure.

    ``panels``: ``"dashboard"`` (the default) or panel groups ``headline``, ``foundations``, ``sanity``; ``metrics``:
    metric names (each comma-separated or a list). Either of the latter draws a paper figure ``width`` inches wide
    (default 3.4); ``overlay``: its runs on one axis instead of one column each.
    """
    for h in histories:
        if h.x == "step":
            h.benchmark = benchmark_points(h)  # the slow benchmark's points, when its history is beside the run's
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
