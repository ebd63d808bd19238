"""Draw the probe's curves: ``tinymcf plot HISTORY.jsonl [MORE.jsonl ...] [--out curves.png]``.

Reads the JSONL histories that ``MoralProbeCallback`` appends (``<output_dir>/moral_probe_<name>.jsonl``,
one line per probe) and draws them against the training step, or a dose-response history
(``moral_probe_<name>_dose.jsonl``, ``x="coefficient"`` when loading) against the steering
coefficient: the real direction's curve with its interval, the random directions' range as a grey
band with their median as a thin grey line, and an ``x`` where the model stopped answering. Where a
line carries interval bounds (``score_lo``/``score_hi`` at the top level, ``align_other_lo``/
``align_other_hi`` in a table row, ...) the interval is a shaded band; a history without them is
drawn without bands. Several runs of the same set share one figure, labelled with the run folder's
name. Histories of different answer formats (Yes/No, JSON true/false: the line's ``answer_format``,
Yes/No when absent) never share a file or a figure. From Python: :func:`plot_histories`.

Two kinds of figure (:func:`draw`):

* the **dashboard** (the default; :mod:`~tinymcf_callback.figures.overview`): every panel (headline,
  per foundation, sanity), several runs overlaid, 15 in wide, for looking at a run;
* a **paper figure** (``panels`` other than ``"dashboard"``, or ``metrics``;
  :mod:`~tinymcf_callback.figures.paper`): the chosen panel groups or metrics only, one journal column
  wide, several runs as small multiples (or overlaid).

What both draw with (run colours and markers, interval bands, the dose-response marks, the image
formats) is in :mod:`~tinymcf_callback.figures.drawing`. Reading the histories needs only numpy
(:mod:`tinymcf_callback.views.curves`); drawing needs matplotlib, the optional ``[plot]`` extra,
imported when a figure is made.

Which line is drawn when a history repeats itself (both rules are documented in the README):

* a ``train_begin`` line after other lines is the step-0 baseline of a new run written into the same
  output folder: the earlier lines belong to the previous run and are dropped, with a warning;
* a step logged more than once (a run resumed from an earlier checkpoint re-probes the steps after
  it): the last line in the file wins, with a warning.
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

    ``panels``: ``"dashboard"`` (the default) or panel groups ``headline``, ``foundations``, ``sanity``
    (comma-separated or a list); ``metrics``: metric names (comma-separated or a list). Either of
    the latter draws a paper figure ``width`` inches wide (default 3.4); ``overlay``: its runs on one
    axis instead of one column each. Raises :class:`PlotOptionError` for an option it cannot use.
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
