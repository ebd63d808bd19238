"""A history's curves: one :class:`History` per run file, numpy arrays per metric, ready to draw.

Reading needs only numpy (drawing, :mod:`tinymcf_callback.figures`, needs matplotlib); the lines kept are the
history's own rules (:mod:`~tinymcf_callback.rundir.history`). What is drawn from which lines: docs/cli.md,
``tinymcf plot``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data.sets import FOUNDATIONS
from ..errors import HistoryError, PlotOptionError
from ..rundir.history import (
    DOSE_DIRECTIONS,
    DOSE_LINE_FIELDS,
    current_run,
    is_dose_history,
    is_point,
    last_line_per_step,
    line_precisions,
    read_lines,
    resolve_history_path,
)
from ..rundir.precision import Precision
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from ..stats.metrics import answer_format

logger = logging.getLogger("tinymcf_callback")

HEADLINE = ("score", "sn", "score_minus_sn", "gap")  # the line's fields (score_minus_sn is derived)
FOUNDATION_METRICS = ("align_other", "align_self")
SANITY = ("yn_mass_mean", "yn_mass_min", "frame_agreement", "human_corr")  # keys of the line's ``info``
_SHOWN = 5  # repeated keys named in a warning
X_AXES = ("step", "coefficient")  # what a curve is drawn against: the training step, or the steering coefficient
DOSE_FIELDS = tuple(DOSE_LINE_FIELDS)[:3]  # the fields a dose-response line must carry (answering is optional)


@dataclass
class Series:
    """One curve: estimates at each step, and its interval bounds (None: the history has no interval for it)."""

    est: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


@dataclass
class Envelope:
    """The random directions' control at each coefficient: min and max (the band) and median over the k directions."""

    x: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    median: np.ndarray
    k: int


@dataclass
class History:
    """The curves of one run on one vignette set, one point per probed step (ascending); for a dose-response history
    (``x == "coefficient"``) one per steering coefficient of the real direction, with one curve per random direction.
    """

    path: Path
    label: str  # the legend entry: the run folder's name
    name: str  # the vignette set
    steps: np.ndarray  # the x values: training steps, or steering coefficients (x == "coefficient")
    headline: dict[str, Series]  # score, sn, score_minus_sn, gap
    foundations: dict[str, dict[str, Series]]  # foundation -> align_other / align_self
    sanity: dict[str, np.ndarray]  # yn_mass_mean, yn_mass_min, frame_agreement, human_corr
    level: float | None  # the intervals' level, when the lines say it
    answer_format: str = DEFAULT_ANSWER_FORMAT  # "yesno" or "json": which answers the probe read
    precision: Precision | None = None  # the precision of every line, when they agree
    subset: dict | None = None  # which vignettes the newest point asked (info.subset, with n_vignettes)
    x: str = "step"  # "step" (a training history) or "coefficient" (a dose-response history)
    answering: np.ndarray | None = None  # dose-response: False where Yes+No mass fell below 0.5 ("answering": false)
    random: list[History] = field(default_factory=list)  # dose-response: one curve per random direction
    # the change since the step-0 baseline at each point: its p-value, and the run-level one (metrics.run_level_p)
    change_p: np.ndarray | None = None
    change_p_run: np.ndarray | None = None
    # the slow benchmark's points at its steps (the figures read moral_bench_<name>.jsonl into it): each
    # {"step", "what", "value", "lo", "hi"}, an accuracy in [0, 1] drawn on an axis of its own
    benchmark: list[dict] = field(default_factory=list)

    def flagged(self) -> tuple[np.ndarray, np.ndarray]:
        """Where the change since step 0 is flagged at ``1 - level`` (0.05 when the lines do not say): by its own
        step's p-value, and over the run (``score_change_p_run``, whose false flags are held to that rate over
        every step of the run together). All False without change p-values."""
        alpha = 1.0 - (self.level or 0.95)
        none = np.zeros(len(self.steps), dtype=bool)
        step = none if self.change_p is None else np.nan_to_num(self.change_p, nan=1.0) < alpha
        run = none if self.change_p_run is None else np.nan_to_num(self.change_p_run, nan=1.0) < alpha
        return step, run

    def series(self, key: str) -> Series:
        """The curve of metric ``key`` (a :func:`metric_key`); all NaN for a foundation this history lacks."""
        if key in HEADLINE:
            return self.headline[key]
        if key in SANITY:
            return Series(self.sanity[key])
        metric, _, foundation = key.partition(":")
        if metric not in FOUNDATION_METRICS or not foundation:
            raise PlotOptionError(f"unknown metric {key!r}: {known_metrics_text()}")
        curves = self.foundations.get(foundation)
        return curves[metric] if curves is not None else Series(np.full(len(self.steps), math.nan))

    def has_value(self, key: str) -> bool:
        """Whether metric ``key`` has a finite value at some point of this curve."""
        return bool(np.isfinite(self.series(key).est).any())

    def random_envelope(self, key: str) -> Envelope | None:
        """Min, max and median of ``key`` over the random directions at each of their coefficients (None: none); NaN
        where no random direction has a finite value (a gap in the band)."""
        if not self.random:
            return None
        xs = np.unique(np.concatenate([r.steps for r in self.random]))
        values = np.full((len(self.random), len(xs)), math.nan)
        for i, r in enumerate(self.random):
            values[i, np.searchsorted(xs, r.steps)] = r.series(key).est
        lo, hi, median = (np.full(len(xs), math.nan) for _ in range(3))
        known = np.isfinite(values).any(axis=0)
        if known.any():
            lo[known] = np.nanmin(values[:, known], axis=0)
            hi[known] = np.nanmax(values[:, known], axis=0)
            median[known] = np.nanmedian(values[:, known], axis=0)
        return Envelope(xs, lo, hi, median, len(self.random))


def foundation_order(names: Iterable[str]) -> list[str]:
    """``names`` without repeats, the standard foundations first in their order, then the others sorted."""
    present = set(names)
    return [f for f in FOUNDATIONS if f in present] + sorted(present - set(FOUNDATIONS))


def known_metrics_text(foundations: Iterable[str] = ()) -> str:
    found = foundation_order([*FOUNDATIONS, *foundations])
    return (f"the known metrics are {', '.join(HEADLINE)} (headline); a foundation ({', '.join(found)}) for its "
            f"align_other, or align_other:<foundation> / align_self:<foundation>; {', '.join(SANITY)} (sanity)")


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("-", " ").lower().split())


def metric_key(name: str, foundations: Iterable[str] = ()) -> str:
    """The canonical name of metric ``name`` (``"care"``: ``"align_other:Care"``); unknown: :class:`PlotOptionError`.

    A foundation's name is matched ignoring case, ``_`` and ``-``; ``foundations``: names beyond the standard ones.
    """
    text = name.strip()
    if text.lower() in HEADLINE or text.lower() in SANITY:
        return text.lower()
    metric, sep, foundation = text.partition(":")
    if not sep:
        metric, foundation = "align_other", text
    metric = metric.strip().lower()
    by_norm = {_norm(f): f for f in foundation_order([*FOUNDATIONS, *foundations])}
    if metric in FOUNDATION_METRICS and _norm(foundation) in by_norm:
        return f"{metric}:{by_norm[_norm(foundation)]}"
    raise PlotOptionError(f"unknown metric {name!r}: {known_metrics_text(foundations)}")


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
    order = foundation_order(f for r in rows for f in r)
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


def _check_x(x: str) -> str:
    if x not in X_AXES:
        raise PlotOptionError(f"unknown x axis {x!r}: choose step (a training history) or coefficient (a "
                              f"dose-response history, moral_probe_<name>_dose.jsonl)")
    return x


def resolve_curve_path(path: str | Path, x: str = "step") -> Path:
    """The history ``path`` names, as :func:`resolve_history_path`; a run folder holding both a training history and
    a dose-response one gives the dose file with ``x="coefficient"`` and the other with ``x="step"``."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("moral_probe_*.jsonl"))
        wanted = [p for p in found if is_dose_history(p) == (x == "coefficient")]
        if len(found) > 1 and len(wanted) == 1:
            return wanted[0]
    return resolve_history_path(path)


def _curves(path: Path, kept: list[tuple[int, dict]]) -> dict:
    """The fields of a :class:`History` read from ``kept`` lines (one per point, in drawing order)."""
    return {"headline": headline_series(path, kept), "foundations": foundation_series(path, kept),
            "sanity": {key: np.array([_number(path, n, key, line["info"].get(key)) for n, line in kept])
                       for key in SANITY},
            "change_p": _metric(path, kept, "score_change_p"),
            "change_p_run": _metric(path, kept, "score_change_p_run")}


def _metric(path: Path, kept: list[tuple[int, dict]], key: str) -> np.ndarray | None:
    """A logged metric (``.../<key>`` in the lines' ``metrics``) at each point, NaN where absent; None if nowhere."""
    values, any_ = [], False
    for n, line in kept:
        metrics = line.get("metrics") or {}
        name = next((k for k in metrics if k.endswith(f"/{key}")), None)
        any_ = any_ or name is not None
        values.append(_number(path, n, key, metrics.get(name)) if name else math.nan)
    return np.array(values) if any_ else None


def _dose_key(path: Path, lineno: int, line: dict) -> tuple[str, int, float]:
    """A dose-response line's (direction, direction_index, coefficient), checked."""
    where = f"{path}:{lineno}: a dose-response history line"
    if "coefficient" not in line:
        raise HistoryError(f"{where} without a 'coefficient': every line of a moral_probe_<name>_dose.jsonl history "
                           f"carries coefficient, direction and direction_index")
    c = line["coefficient"]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
        raise HistoryError(f"{where}: coefficient is {c!r}, not a finite number")
    direction = line.get("direction")
    if direction not in DOSE_DIRECTIONS:
        raise HistoryError(f"{where}: direction is {direction!r}, not one of {', '.join(DOSE_DIRECTIONS)}")
    index = line.get("direction_index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise HistoryError(f"{where}: direction_index is {index!r}, not a non-negative integer")
    answering = line.get("answering", True)
    if not isinstance(answering, bool):
        raise HistoryError(f"{where}: answering is {answering!r}, not true or false")
    return direction, index if direction == "random" else 0, float(c)


def dose_lines(path: Path, run: list[tuple[int, dict]]) -> dict[tuple[str, int], list[tuple[int, dict]]]:
    """The lines of each (direction, direction_index), by ascending coefficient, the last line of a repeated key
    winning; the unsteered lines (direction ``none``) under ``("none", 0)``, not merged into the others here."""
    by_key: dict[tuple[str, int, float], tuple[int, dict]] = {}
    repeated = []
    for lineno, line in run:
        key = _dose_key(path, lineno, line)
        if key in by_key:
            repeated.append(key)
        by_key[key] = (lineno, line)
    if repeated:
        shown = ", ".join(f"{d}{'' if d != 'random' else f' #{i}'} at c={c:g}" for d, i, c in
                          sorted(set(repeated))[:_SHOWN])
        more = "" if len(set(repeated)) <= _SHOWN else ", ..."
        logger.warning("%s: %s%s logged more than once; drawing the last line of each", path, shown, more)
    out: dict[tuple[str, int], list[tuple[int, dict]]] = {}
    for (direction, index, _), record in sorted(by_key.items(), key=lambda kv: kv[0]):
        out.setdefault((direction, index), []).append(record)
    return out


def _with_unsteered(unsteered: list[tuple[int, dict]], own: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """A direction's lines with the unsteered ones at coefficients it has no line of its own for, by coefficient."""
    mine = {float(line["coefficient"]) for _, line in own}
    merged = [r for r in unsteered if float(r[1]["coefficient"]) not in mine] + own
    return sorted(merged, key=lambda r: float(r[1]["coefficient"]))


def _coefficients(kept: list[tuple[int, dict]]) -> np.ndarray:
    return np.array([float(line["coefficient"]) for _, line in kept], dtype=float)


def _check_one_set(path: Path, lines: list[tuple[int, dict]]) -> tuple[str, str]:
    """The (vignette set, answer format) of a history's lines; refuses a file that mixes sets or formats."""
    names = sorted({line["name"] for _, line in lines})
    if len(names) > 1:
        raise HistoryError(f"{path} mixes vignette sets {names}: a history holds one set (moral_probe_<name>.jsonl)")
    formats = sorted({answer_format(line) for _, line in lines})
    if len(formats) > 1:
        first = {f: next(n for n, line in lines if answer_format(line) == f) for f in formats}
        shown = " and ".join(f"{f!r} (first at line {n})" for f, n in first.items())
        raise HistoryError(f"{path} mixes answer formats {shown}: P(Yes) and P(true) are different readings, so "
                           f"one curve cannot hold both; a history holds one format (moral_probe_<name>.jsonl for "
                           f"yesno, moral_probe_<name>_json.jsonl for json)")
    return names[0], formats[0]


def _warn_precisions(path: Path, kept: list[tuple[int, dict]]) -> Precision | None:
    precisions = line_precisions(kept)
    if len(precisions) > 1:
        logger.warning("%s: WARNING: its probes were scored in %s; a change along the curve between them is partly "
                       "the precision's, not the model's", path, " and ".join(
                           f"{k} (from step {step})" for k, step in precisions.items()))
    return next(iter(precisions), None) if len(precisions) == 1 else None


def load_history(path: str | Path, label: str | None = None, *, x: str = "step") -> History:
    """Read one history file (or the run folder holding it) into curves; raises :class:`HistoryError`.

    ``x="step"`` (default): a training history, against the step. ``x="coefficient"``: a dose-response
    history (``moral_probe_<name>_dose.jsonl``), against the steering coefficient. Each refuses the other
    kind of file, naming it and the ``--x`` that draws it.
    """
    path = resolve_curve_path(path, _check_x(x))
    lines = read_lines(path)  # every line checked
    dose = next((n for n, line in lines if any(f in line for f in DOSE_FIELDS)), None)
    if x == "step" and dose is not None:
        raise HistoryError(f"{path} is a dose-response history (line {dose} carries a steering coefficient or "
                           f"direction; its step is only the line's index in the sweep): draw it against the "
                           f"coefficient with --x coefficient (x='coefficient')")
    if x == "coefficient" and dose is None:
        raise HistoryError(f"{path} has no 'coefficient' field: it is a training history, not a dose-response one "
                           f"(moral_probe_<name>_dose.jsonl); draw it against the step with --x step")
    name, fmt = _check_one_set(path, lines)
    label = label or run_label(path)
    if x == "step":
        kept = last_line_per_step(path, current_run(path, lines))
        precision = _warn_precisions(path, kept)
        _warn_subsets(path, kept)
        return History(path=path, label=label, name=name, steps=np.array([line["step"] for _, line in kept],
                       dtype=float), **_curves(path, kept), level=interval_level(kept), answer_format=fmt,
                       precision=precision, subset=_subset(kept))
    groups = dose_lines(path, current_run(path, lines))
    unsteered = groups.pop(("none", 0), [])
    real = _with_unsteered(unsteered, groups.pop(("real", 0), []))
    if not real:
        raise HistoryError(f"{path}: a dose-response history without an unsteered (direction 'none') or a 'real' "
                           f"direction line: nothing to draw against the coefficient")
    random = []
    for (_, index), own in sorted(groups.items()):
        kept = _with_unsteered(unsteered, own)
        random.append(History(path=path, label=f"{label} · random {index}", name=name, steps=_coefficients(kept),
                              **_curves(path, kept), level=None, answer_format=fmt, x=x))
    everything = sorted(unsteered + real + [r for own in groups.values() for r in own], key=lambda r: r[0])
    return History(path=path, label=label, name=name, steps=_coefficients(real), **_curves(path, real),
                   level=interval_level(real), answer_format=fmt, precision=_warn_precisions(path, everything), x=x,
                   answering=np.array([line.get("answering", True) is not False for _, line in real]), random=random)


def history_of(lines: list[dict], path: Path, label: str | None = None) -> History:
    """The curve so far of a probe's history lines held in memory (a tracker's figure at each probe), read by the
    rules :func:`load_history` reads a file by: the points only (gap lines leave a gap), the last line of each step,
    in step order. ``path`` is the history the lines belong to (named in messages); no warning is logged."""
    points = [line for line in lines if is_point(line)]
    if not points:
        raise HistoryError(f"{path}: no scored point to draw yet")
    newest = {line["step"]: line for line in points}
    kept = [(n + 1, newest[step]) for n, step in enumerate(sorted(newest))]
    last = kept[-1][1]
    precisions = line_precisions(kept)
    precision = next(iter(precisions)) if len(precisions) == 1 else None
    return History(path=path, label=label or run_label(path), name=last["name"], steps=np.array(sorted(newest),
                   dtype=float), **_curves(path, kept), level=interval_level(kept), answer_format=answer_format(last),
                   precision=precision, subset=_subset(kept))


def _subset(kept: list[tuple[int, dict]]) -> dict | None:
    """The vignettes the newest point asked: its ``info.subset`` with ``n_vignettes`` (None when it does not say)."""
    adaptive = [line["info"]["adaptive"] for _, line in kept if isinstance(line["info"].get("adaptive"), dict)]
    for _, line in reversed(kept):
        subset = line["info"].get("subset")
        if isinstance(subset, dict):
            out = {**subset, "n_vignettes": line["info"].get("n_vignettes")}
            if adaptive:  # a precision target: the subset is its candidates; each point asked a prefix of them
                asked = [a.get("vignettes") for a in adaptive if isinstance(a.get("vignettes"), int)]
                out["adaptive"] = {"until": adaptive[-1].get("until"), "of": adaptive[-1].get("of_vignettes"),
                                   "asked": (min(asked), max(asked)) if asked else None}
            return out
    return None


def subset_label(subset: dict | None) -> str:
    """``per_foundation=2 (14 vignettes)``, ``limit=7 (7 vignettes)``, ``the whole set (51 vignettes)``; a precision
    target's points ``until=change: 14-51 of 51 vignettes asked`` (each stopped where it knew enough)."""
    if not subset:
        return "vignettes not recorded"
    adaptive = subset.get("adaptive")
    if adaptive and adaptive.get("asked"):
        lo, hi = adaptive["asked"]
        asked = f"{lo}" if lo == hi else f"{lo}-{hi}"
        of = f" of {adaptive['of']}" if isinstance(adaptive.get("of"), int) else ""
        return f"until={adaptive['until']}: {asked}{of} vignettes asked"
    n = subset.get("n_vignettes")
    count = f" ({n} vignettes)" if isinstance(n, int) else ""
    if subset.get("per_foundation") is not None:
        seed = subset.get("subset_seed") or 0
        return f"per_foundation={subset['per_foundation']}{f', seed {seed}' if seed else ''}{count}"
    if subset.get("limit") is not None:
        return f"limit={subset['limit']}{count}"
    return f"the whole set{count}"


def _warn_subsets(path: Path, kept: list[tuple[int, dict]]) -> None:
    """A curve whose points asked about other vignettes (another subset) is drawn, with a warning naming where."""
    subsets = [(line["step"], (line["info"].get("subset") or {}).get("vignettes")) for _, line in kept]
    subsets = [(step, digest) for step, digest in subsets if digest]
    changes = [step for (_, a), (step, b) in zip(subsets, subsets[1:], strict=False) if a != b]
    if changes:
        logger.warning("%s: the curve asks about other vignettes from step %s on (another subset: limit, "
                       "per_foundation or subset_seed); its points before and after do not compare like with like",
                       path, ", ".join(map(str, changes)))


def _distinct_labels(paths: list[Path]) -> list[str]:
    """Run folder names, with as many parent folders as it takes to tell equal names apart (``seed0/demo``)."""
    parents = [p.resolve().parent.parts for p in paths]
    for depth in range(1, max(len(p) for p in parents) + 1):
        labels = ["/".join(p[-depth:]) for p in parents]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def load_histories(paths, *, x: str = "step") -> list[History]:
    """Read several histories for one figure (different files of one vignette set); ``x`` as :func:`load_history`."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    resolved = [resolve_curve_path(p, _check_x(x)) for p in paths]
    if not resolved:
        raise HistoryError("no history given: pass one or more moral_probe_<name>.jsonl files")
    seen: dict[Path, Path] = {}
    for p in resolved:
        if p.resolve() in seen:
            raise HistoryError(f"the history {p} is given twice (also as {seen[p.resolve()]})")
        seen[p.resolve()] = p
    histories = [load_history(p, label, x=x) for p, label in zip(resolved, _distinct_labels(resolved), strict=True)]
    first = histories[0]
    precisions = {h.precision for h in histories if h.precision is not None}
    if len(precisions) > 1:
        logger.warning("WARNING: the runs in this figure were scored in different precisions (%s): their curves "
                       "differ partly by precision, not by model", "; ".join(
                           f"{h.label}: {h.precision}" for h in histories if h.precision))
    for other in histories[1:]:
        if other.name != first.name:
            raise HistoryError(f"histories of different vignette sets cannot share a figure: {first.path} is "
                               f"{first.name!r}, {other.path} is {other.name!r}; draw one figure per set")
        if other.answer_format != first.answer_format:
            raise HistoryError(f"histories of different answer formats cannot share a figure: {first.path} reads "
                               f"{first.answer_format!r} answers, {other.path} {other.answer_format!r}; P(Yes) and "
                               f"P(true) are different readings: draw one figure per answer format")
    return histories


