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

import argparse
import io
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._io import atomic_write_bytes, read_jsonl
from .comparison import describe_precision, precision_key
from .prompts import DEFAULT_ANSWER_FORMAT, answer_format_of
from .sets import CONTROL, FOUNDATIONS

logger = logging.getLogger("tinymcf_callback")

INSTALL_HINT = "pip install 'tinymcf_callback[plot]'"
FORMATS = ("png", "svg", "pdf")
HEADLINE = ("score", "sn", "score_minus_sn", "gap")  # the line's fields (score_minus_sn is derived)
FOUNDATION_METRICS = ("align_other", "align_self")
SANITY = ("yn_mass_mean", "yn_mass_min", "frame_agreement", "human_corr")  # keys of the line's ``info``
# Okabe & Ito (2008), "Color Universal Design": distinct for protanopes, deuteranopes and tritanopes.
# Yellow (#F0E442) comes last: it is hard to see on white.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
RUN_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
NEW_RUN_EVENT = "train_begin"  # the callback's step-0 baseline: the first line of a run started from scratch
_SHOWN_STEPS = 5


class HistoryError(ValueError):
    """A history file that cannot be drawn: missing, empty, malformed, or mixed with another set's history."""


class MissingPlotExtraError(ImportError):
    """matplotlib, the ``[plot]`` extra, is not installed."""


@dataclass
class Series:
    """One curve: estimates at each step, and its interval bounds (None: the history has no interval for it)."""

    est: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


@dataclass
class History:
    """The curves of one run on one vignette set, one point per probed step (ascending)."""

    path: Path
    label: str  # the legend entry: the run folder's name
    name: str  # the vignette set
    steps: np.ndarray
    headline: dict[str, Series]  # score, sn, score_minus_sn, gap
    foundations: dict[str, dict[str, Series]]  # foundation -> align_other / align_self
    sanity: dict[str, np.ndarray]  # yn_mass_mean, yn_mass_min, frame_agreement, human_corr
    level: float | None  # the intervals' level, when the lines say it
    answer_format: str = DEFAULT_ANSWER_FORMAT  # "yesno" or "json": which answers the probe read
    precision: tuple[str, str | None] | None = None  # (weights dtype, autocast) of every line, when they agree


# ---- reading (numpy only) --------------------------------------------------------------------------
def resolve_history_path(path: str | Path) -> Path:
    """The history file ``path`` names: the file itself, or the one ``moral_probe_*.jsonl`` in a run folder."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("moral_probe_*.jsonl"))
        if len(found) == 1:
            return found[0]
        if not found:
            raise HistoryError(f"{path} is a folder without a moral_probe_<name>.jsonl history: pass the history "
                               f"file (MoralProbeCallback writes it into the Trainer's output_dir)")
        raise HistoryError(f"{path} holds {len(found)} histories ({', '.join(p.name for p in found)}): "
                           f"name the file of the set to draw")
    if not path.exists():
        raise HistoryError(f"no history file {path}: MoralProbeCallback writes <output_dir>/moral_probe_<name>.jsonl "
                           f"(the Trainer's output_dir), one line per probe")
    return path


def read_history_lines(path: Path) -> list[tuple[int, dict]]:
    """The history's ``(line number, line)`` pairs; a torn last line (an append cut short) is skipped with a warning."""
    try:
        raw = path.read_text(encoding="utf-8")
        lines = read_jsonl(path)
    except ValueError as e:
        raise HistoryError(f"malformed history line: {e}") from None
    except OSError as e:
        raise HistoryError(f"cannot read the history {path}: {e.strerror}") from None
    last = raw.count("\n") + 1  # the number of the unterminated last line, when there is one
    if raw.rsplit("\n", 1)[-1].strip() and (not lines or lines[-1][0] != last):
        logger.warning("%s:%d: skipped an unterminated last line (an append cut short); drawing the lines before it",
                       path, last)
    if not lines:
        raise HistoryError(f"the history {path} is empty: no probe has been logged into it yet")
    return lines


def _number(path: Path, lineno: int, field: str, value) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HistoryError(f"{path}:{lineno}: {field} is {value!r}, not a number")
    return float(value)


def check_line(path: Path, lineno: int, line: dict) -> None:
    """Refuse a line that is not a probe record in the callback's schema, naming the file, line and field."""
    hint = "not a moral-probe history line (MoralProbeCallback writes moral_probe_<name>.jsonl)"
    for field, kind in (("step", int), ("name", str), ("info", dict), ("table", list)):
        value = line.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise HistoryError(f"{path}:{lineno}: {hint}: {field!r} is {value!r}")
    if line["step"] < 0:
        raise HistoryError(f"{path}:{lineno}: step {line['step']} is negative")
    try:
        answer_format_of(line_format(line))
    except ValueError:
        raise HistoryError(f"{path}:{lineno}: {hint}: unknown answer_format {line['answer_format']!r}") from None
    for row in line["table"]:
        if not isinstance(row, dict) or not isinstance(row.get("foundation"), str):
            raise HistoryError(f"{path}:{lineno}: {hint}: a table row without a 'foundation' name: {row!r}")


def current_run(path: Path, lines: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """The lines of the newest run: a ``train_begin`` line after others starts a new run in the same folder."""
    starts = [i for i, (_, line) in enumerate(lines) if line.get("event") == NEW_RUN_EVENT]
    if not starts or starts[-1] == 0:
        return lines
    first = starts[-1]
    logger.warning("%s:%d: a new run starts here (a %s baseline); the %d line(s) above it belong to an earlier run "
                   "in the same output folder and are not drawn", path, lines[first][0], NEW_RUN_EVENT, first)
    return lines[first:]


def last_line_per_step(path: Path, lines: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """One line per step, in step order: when a step was logged more than once, the last line in the file wins."""
    by_step: dict[int, tuple[int, dict]] = {}
    repeated = []
    for lineno, line in lines:
        if line["step"] in by_step:
            repeated.append(line["step"])
        by_step[line["step"]] = (lineno, line)
    if repeated:
        shown = ", ".join(str(s) for s in sorted(set(repeated))[:_SHOWN_STEPS])
        more = "" if len(set(repeated)) <= _SHOWN_STEPS else ", ..."
        logger.warning("%s: step(s) %s%s logged more than once (a resumed run re-probes the steps after its "
                       "checkpoint); drawing the last line of each", path, shown, more)
    return [by_step[s] for s in sorted(by_step)]


def _series(path: Path, records: list[tuple[int, dict]], field: str) -> Series:
    """The curve of ``field`` in ``records`` (line, dict) pairs, with ``<field>_lo``/``_hi`` bounds when any exist."""
    est = np.array([_number(path, n, field, r.get(field)) for n, r in records])
    if not any(f"{field}_lo" in r and f"{field}_hi" in r for _, r in records):
        return Series(est)
    lo = np.array([_number(path, n, f"{field}_lo", r.get(f"{field}_lo")) for n, r in records])
    hi = np.array([_number(path, n, f"{field}_hi", r.get(f"{field}_hi")) for n, r in records])
    tol = 1e-9
    outside = np.isfinite(est) & np.isfinite(lo) & np.isfinite(hi) & ((lo > est + tol) | (hi < est - tol))
    if outside.any():
        n, _ = records[int(np.argmax(outside))]
        raise HistoryError(f"{path}:{n}: {field}={est[outside][0]:+.4f} lies outside its interval "
                           f"[{lo[outside][0]:+.4f}, {hi[outside][0]:+.4f}]")
    return Series(est, lo, hi)


def headline_series(path: Path, kept: list[tuple[int, dict]]) -> dict[str, Series]:
    """score, sn, gap as logged; ``score_minus_sn`` is ``score - sn`` (its bounds only when the line has them)."""
    records = []
    for n, line in kept:
        record = dict(line)
        score, sn = _number(path, n, "score", line.get("score")), _number(path, n, "sn", line.get("sn"))
        record.setdefault("score_minus_sn", score - sn if math.isfinite(score - sn) else None)
        records.append((n, record))
    return {field: _series(path, records, field) for field in HEADLINE}


def foundation_series(path: Path, kept: list[tuple[int, dict]]) -> dict[str, dict[str, Series]]:
    """``align_other`` and ``align_self`` of each foundation present at some step (NaN at steps without it)."""
    rows = [{row["foundation"]: row for row in line["table"]} for _, line in kept]
    present = {f for r in rows for f in r}
    order = [f for f in FOUNDATIONS if f in present] + sorted(present - set(FOUNDATIONS))
    out = {}
    for foundation in order:
        records = [(n, r.get(foundation, {})) for (n, _), r in zip(kept, rows, strict=True)]
        out[foundation] = {metric: _series(path, records, metric) for metric in FOUNDATION_METRICS}
    return out


def interval_level(kept: list[tuple[int, dict]]) -> float | None:
    """The intervals' level (e.g. 0.95) from the lines' ``level`` field, when all lines that have it agree."""
    levels = {line["level"] for _, line in kept if isinstance(line.get("level"), (int, float))}
    return levels.pop() if len(levels) == 1 else None


def line_format(line: dict) -> str:
    """The answer format of a history line; lines written before formats existed are Yes/No."""
    return line.get("answer_format", DEFAULT_ANSWER_FORMAT)


def line_precisions(kept: list[tuple[int, dict]]) -> dict[tuple[str, str | None], int]:
    """Each precision the lines record, with the first step scored in it (lines that record none are left out)."""
    out: dict[tuple[str, str | None], int] = {}
    for _, line in kept:
        key = precision_key(line)
        if key is not None:
            out.setdefault(key, line["step"])
    return out


def run_label(path: Path) -> str:
    """The legend entry of a history: the name of the run folder that holds it."""
    return path.resolve().parent.name or str(path)


def load_history(path: str | Path, label: str | None = None) -> History:
    """Read one history file (or the run folder holding it) into curves; raises :class:`HistoryError`."""
    path = resolve_history_path(path)
    lines = read_history_lines(path)
    for lineno, line in lines:
        check_line(path, lineno, line)
    names = sorted({line["name"] for _, line in lines})
    if len(names) > 1:
        raise HistoryError(f"{path} mixes vignette sets {names}: a history holds one set (moral_probe_<name>.jsonl)")
    formats = sorted({line_format(line) for _, line in lines})
    if len(formats) > 1:
        first = {f: next(n for n, line in lines if line_format(line) == f) for f in formats}
        shown = " and ".join(f"{f!r} (first at line {n})" for f, n in first.items())
        raise HistoryError(f"{path} mixes answer formats {shown}: P(Yes) and P(true) are different readings, so "
                           f"one curve cannot hold both; a history holds one format (moral_probe_<name>.jsonl for "
                           f"yesno, moral_probe_<name>_json.jsonl for json)")
    kept = last_line_per_step(path, current_run(path, lines))
    precisions = line_precisions(kept)
    if len(precisions) > 1:
        logger.warning("%s: WARNING: its probes were scored in %s; a change along the curve between them is partly "
                       "the precision's, not the model's", path, " and ".join(
                           f"{describe_precision(k)} (from step {step})" for k, step in precisions.items()))
    return History(
        path=path, label=label or run_label(path), name=names[0],
        steps=np.array([line["step"] for _, line in kept], dtype=float),
        headline=headline_series(path, kept),
        foundations=foundation_series(path, kept),
        sanity={key: np.array([_number(path, n, key, line["info"].get(key)) for n, line in kept]) for key in SANITY},
        level=interval_level(kept),
        answer_format=formats[0],
        precision=next(iter(precisions), None) if len(precisions) == 1 else None,
    )


def _distinct_labels(paths: list[Path]) -> list[str]:
    """Run folder names, with as many parent folders as it takes to tell equal names apart (``seed0/demo``)."""
    parents = [p.resolve().parent.parts for p in paths]
    for depth in range(1, max(len(p) for p in parents) + 1):
        labels = ["/".join(p[-depth:]) for p in parents]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def load_histories(paths) -> list[History]:
    """Read several histories for one figure: they must be different files of the same vignette set."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    resolved = [resolve_history_path(p) for p in paths]
    if not resolved:
        raise HistoryError("no history given: pass one or more moral_probe_<name>.jsonl files")
    seen: dict[Path, Path] = {}
    for p in resolved:
        if p.resolve() in seen:
            raise HistoryError(f"the history {p} is given twice (also as {seen[p.resolve()]})")
        seen[p.resolve()] = p
    histories = [load_history(p, label) for p, label in zip(resolved, _distinct_labels(resolved), strict=True)]
    first = histories[0]
    precisions = {h.precision for h in histories if h.precision is not None}
    if len(precisions) > 1:
        logger.warning("WARNING: the runs in this figure were scored in different precisions (%s): their curves "
                       "differ partly by precision, not by model", "; ".join(
                           f"{h.label}: {describe_precision(h.precision)}" for h in histories if h.precision))
    for other in histories[1:]:
        if other.name != first.name:
            raise HistoryError(f"histories of different vignette sets cannot share a figure: {first.path} is "
                               f"{first.name!r}, {other.path} is {other.name!r}; draw one figure per set")
        if other.answer_format != first.answer_format:
            raise HistoryError(f"histories of different answer formats cannot share a figure: {first.path} reads "
                               f"{first.answer_format!r} answers, {other.path} {other.answer_format!r}; P(Yes) and "
                               f"P(true) are different readings: draw one figure per answer format")
    return histories


# ---- drawing (matplotlib) --------------------------------------------------------------------------
def require_matplotlib():
    """The matplotlib module, or :class:`MissingPlotExtraError` naming the extra to install."""
    try:
        import matplotlib
        import matplotlib.figure
        import matplotlib.lines
        import matplotlib.patches
        import matplotlib.ticker
    except ImportError:
        raise MissingPlotExtraError(f"drawing the curves needs matplotlib, the optional [plot] extra: "
                                    f"{INSTALL_HINT}") from None
    return matplotlib


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
    Raises :class:`HistoryError` for bad input and :class:`MissingPlotExtraError` without matplotlib.
    """
    if out is not None:
        image_format(out)  # a wrong suffix fails before the drawing
    histories = load_histories(paths)
    fig = draw(histories, title=title)
    if out is not None:
        save_figure(fig, out)
    return fig


# ---- command line ------------------------------------------------------------------------------------
def default_out(histories: list[History]) -> Path:
    """One history: next to it, ``moral_probe_<name>.png``; several: that name in the current folder."""
    first = histories[0].path
    return first.with_suffix(".png") if len(histories) == 1 else Path(first.with_suffix(".png").name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tinymcf_callback.plot",
                                description="Draw the moral probe's curves against the training step from one or "
                                            "more JSONL histories (moral_probe_<name>.jsonl) of the same vignette set.")
    p.add_argument("histories", nargs="+", metavar="HISTORY",
                   help="moral_probe_<name>.jsonl files (or run folders holding one), all of the same vignette set")
    p.add_argument("--out", default=None, help="image to write, .png, .svg or .pdf (default: moral_probe_<name>.png "
                                               "next to a single history, else in the current folder)")
    p.add_argument("--title", default=None, help="figure title (default: the set and the run names)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.out:
            image_format(args.out)
        histories = load_histories(args.histories)
        out = Path(args.out) if args.out else default_out(histories)
        fig = draw(histories, title=args.title)
    except (HistoryError, MissingPlotExtraError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        save_figure(fig, out)
    except OSError as e:
        print(f"error: cannot write the figure {out}: {e.strerror or e}; pass a writable path with --out",
              file=sys.stderr)
        return 2
    print(f"[tinymcf] curves of {len(histories)} run(s) written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
