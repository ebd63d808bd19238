"""A sink takes one :class:`Point`; :class:`Trackers` feeds several and remembers what did not reach each.

A line sent again (a sweep or a watch sends the lines an earlier one wrote) goes only to the sinks that do not hold
it yet (:meth:`Sink.held`): a tracker keeps every point it is given, so a point sent twice is drawn twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import one_line
from ..rundir.history import BASELINE_EVENT, is_point
from ..scoring.prompts import DEFAULT_ANSWER_FORMAT
from ..stats.metrics import dashboard_names, probe_key

logger = logging.getLogger(__name__)
# Two values of a metric are the same point when they differ by less than float32's precision (2**-23 relative): the
# coarsest a tracker stores a value in (TensorBoard's scalars); every other tracker keeps the float64 it was given.
SAME_VALUE = 2.0 ** -23


def line_metrics(line: dict) -> dict[str, float]:
    """A history line's metrics under the names dashboards show (``eval/moral_<name>/score``, ...)."""
    return dashboard_names(line.get("metrics") or {})


def line_probe_key(line: dict) -> str | None:
    """The probe a line belongs to, as its metric names carry it (``scifi``, ``scifi_json``); None without a name."""
    name = line.get("name")
    return probe_key(name, line.get("answer_format") or DEFAULT_ANSWER_FORMAT) if name else None


@dataclass
class Point:
    """One line for the trackers: its metrics at its step; for a line just scored, its rows and figure."""

    line: dict
    rows: list[dict] | None = None  # per-vignette rows (views.rows.vignette_rows); None for a line sent again
    figure: object = None  # the curve so far: an RGB uint8 array (height, width, 3), or None
    curve: list[dict] = field(default_factory=list)  # the probe's point lines so far, in step order, this one included

    @property
    def step(self) -> int:
        return self.line["step"]

    @property
    def fresh(self) -> bool:
        """A line just scored (not a line sent again)."""
        return self.rows is not None

    @property
    def mark(self) -> tuple[str, float]:
        """The metric a tracker is asked for to tell whether it holds this point: ``(logged name, value)``, the score
        of a probe line, else the line's first metric."""
        metrics = self.line["metrics"]
        name = next((k for k in metrics if k.endswith("/score") and k.count("/") == 1), next(iter(metrics)))
        return name, metrics[name]


def holds(held: dict[int, list[float]], step: int, value: float) -> bool:
    """Whether ``held`` (step -> the values a tracker keeps of a metric) has ``value`` at ``step``."""
    return any(math.isclose(v, value, rel_tol=SAME_VALUE, abs_tol=0.0) for v in held.get(step, ()))


def by_step(pairs) -> dict[int, list[float]]:
    """``(step, value)`` pairs as :meth:`Sink.held` returns them: step -> the values at it."""
    held: dict[int, list[float]] = {}
    for step, value in pairs:
        held.setdefault(step, []).append(value)
    return held


class Sink:
    """One destination of points; ``finish`` ends what opening it started (a writer, a run)."""

    def __init__(self, what: str, send: Callable[[Point], None], finish: Callable[[], None] | None = None, *,
                 figure: bool = False):
        self.what, self._send, self._finish, self.figure = what, send, finish, figure

    def send(self, point: Point) -> None:
        self._send(point)

    def held(self, name: str) -> dict[int, list[float]] | None:
        """The values of the logged metric ``name`` this destination keeps, by step; None when it cannot tell (the
        point is then sent again)."""
        return None

    def finish(self) -> None:
        if self._finish is not None:
            self._finish()


class Trackers:
    """Several sinks fed point by point. A sink that fails costs its point, never the caller's work: a warning, and
    the step kept in :attr:`missed` (``strict``: the first failure is raised instead). ``figure``: draws the curve so
    far as an RGB image, once per probe; a figure that cannot be drawn is said once and left out.
    """

    def __init__(self, sinks: list[Sink] | tuple = (), *, strict: bool = False,
                 figure: Callable[[list[dict]], object] | None = None):
        self.sinks, self.strict, self.figure = list(sinks), strict, figure
        self.missed: dict[str, list[int]] = {}  # tracker -> steps it did not get
        self.causes: dict[str, str] = {}  # tracker -> the first error it gave
        self.curve: dict[int, dict] = {}  # step -> the newest point line: what the figure draws
        self.resent: dict[str, int] = {}  # tracker -> lines sent to it again (it did not hold them)
        self._held: dict[tuple[int, str], dict[int, list[float]] | None] = {}  # (sink, metric) -> what it holds

    def __bool__(self) -> bool:
        return bool(self.sinks)

    @property
    def names(self) -> list[str]:
        return [sink.what for sink in self.sinks]

    def seed(self, lines: list[dict]) -> None:
        """Start the curve so far from the history's lines (a resumed run, a watcher started again, a resume mark
        that set later steps aside), so that the next figure shows the whole curve."""
        self.curve = {line["step"]: line for line in lines if _on_curve(line)}

    def send(self, line: dict, *, rows: list[dict] | None = None, again: bool = False,
             label: str = "moral probe") -> bool:
        """Give ``line`` to every sink (a gap line, which holds no number, to none); True when all took it. ``again``: a
        line an earlier sweep or watch wrote, sent again (no rows, no figure) only to the sinks that do not hold it."""
        if not line.get("metrics"):
            return True
        point = Point(line, rows=None if again else list(rows or []))
        if _on_curve(line):
            if line.get("event") == BASELINE_EVENT and line["step"] == 0:
                self.curve = {}  # a step-0 baseline starts a new run in the folder: its curve starts again
            self.curve[line["step"]] = line
            point.curve = [self.curve[s] for s in sorted(self.curve)]
            if not again:
                point.figure = self._draw(point.curve, label)
        ok = True
        for sink in self.sinks:
            if again and self._holds(sink, point):
                continue
            try:
                sink.send(point)
            except Exception as e:  # noqa: BLE001 - a tracker's trouble costs its curve, not the history
                if self.strict:
                    raise
                ok = False
                cause = one_line(e, 200)
                self.missed.setdefault(sink.what, []).append(line["step"])
                self.causes.setdefault(sink.what, cause)
                logger.warning("%s: step %d not sent to %s: %s", label, line["step"], sink.what, cause)
                continue
            if again:
                self.resent[sink.what] = self.resent.get(sink.what, 0) + 1
        return ok

    def _holds(self, sink: Sink, point: Point) -> bool:
        """Whether ``sink`` already holds ``point`` (what it holds asked once per metric)."""
        name, value = point.mark
        key = (id(sink), name)
        if key not in self._held:
            try:
                self._held[key] = sink.held(name)
            except Exception as e:  # noqa: BLE001 - not knowing what it holds costs a point sent twice, no more
                logger.warning("moral probe: could not read which points %s holds (%s); the history's lines are "
                               "sent to it again", sink.what, one_line(e, 200))
                self._held[key] = None
        held = self._held[key]
        return held is not None and holds(held, point.step, value)

    def _draw(self, curve: list[dict], label: str):
        if self.figure is None or not any(sink.figure for sink in self.sinks):
            return None
        try:
            return self.figure(curve)
        except Exception as e:  # noqa: BLE001 - a figure that cannot be drawn costs the figure, never the probe
            if self.strict:
                raise
            self.figure = None
            logger.warning("%s: the dashboards get no figure in this run: %s (figure=False, or --no-figure, says so "
                           "without this warning)", label, one_line(e))
            return None

    def undelivered(self) -> list[str]:
        """One sentence per tracker that missed points: which steps, and the first cause."""
        return [f"{what}: step(s) {', '.join(map(str, sorted(set(steps))))} did not reach it ({self.causes[what]})"
                for what, steps in self.missed.items()]

    def close(self) -> None:
        """Finish every sink (a failure is a warning and counts as a miss of that tracker)."""
        for sink in self.sinks:
            try:
                sink.finish()
            except Exception as e:  # noqa: BLE001 - closing a tracker must not lose what was scored
                self.missed.setdefault(sink.what, [])
                self.causes.setdefault(sink.what, f"closing it failed: {type(e).__name__}: {e}")
                logger.warning("moral probe: closing %s failed: %s: %s", sink.what, type(e).__name__, e)


def _on_curve(line: dict) -> bool:
    """A point of the probe's curve (what its figure draws): a scored probe line, which has a ``score``."""
    return is_point(line) and "score" in line and bool(line.get("metrics"))
