"""A history's curves: one :class:`History` per run file, numpy arrays per metric, ready to draw.

Reading needs only numpy (drawing, in :mod:`tinymcf_callback.tools.plot`, needs matplotlib). The
lines kept are the history's own rules (:mod:`~tinymcf_callback.results.history`): the current
run, the last line of each step. Where a line carries interval bounds (``score_lo``/``score_hi``
at the top level, ``align_other_lo``/``align_other_hi`` in a table row, ...) the curve has them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.sets import FOUNDATIONS
from ..errors import HistoryError
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from .history import (
    check_line,
    current_run,
    last_line_per_step,
    line_format,
    line_precisions,
    read_lines,
    resolve_history_path,
)
from .report import describe_precision

logger = logging.getLogger("tinymcf_callback")

HEADLINE = ("score", "sn", "score_minus_sn", "gap")  # the line's fields (score_minus_sn is derived)
FOUNDATION_METRICS = ("align_other", "align_self")
SANITY = ("yn_mass_mean", "yn_mass_min", "frame_agreement", "human_corr")  # keys of the line's ``info``


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


def _number(path: Path, lineno: int, field: str, value) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HistoryError(f"{path}:{lineno}: {field} is {value!r}, not a number")
    return float(value)


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


def run_label(path: Path) -> str:
    """The legend entry of a history: the name of the run folder that holds it."""
    return path.resolve().parent.name or str(path)


def load_history(path: str | Path, label: str | None = None) -> History:
    """Read one history file (or the run folder holding it) into curves; raises :class:`HistoryError`."""
    path = resolve_history_path(path)
    lines = read_lines(path)
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


